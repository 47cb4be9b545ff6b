"""The OpenAI Agents SDK and the OpenAI Python SDK over Chat Completions through `gyre proxy`.

Usage: python openai_agents_chat.py OPENAI_BASE_URL API_KEY

1. A streamed Agents SDK run (`Runner.run_streamed`) of an agent on the SDK's
   `OpenAIChatCompletionsModel` with two function tools, which the model calls in parallel in
   one turn; the SDK accumulates the streamed tool-call deltas, runs both tools and sends the
   whole conversation back (an assistant message with `tool_calls`, then one `tool` message
   per call). Prints every text delta's concatenation, each tool run and the final output.
2. A non-streamed Agents SDK run of an agent whose `output_type` is a pydantic model (the SDK
   asks for `response_format: json_schema`, strict) and parses the answer.
3. The OpenAI SDK's own streaming helper, `client.chat.completions.stream`, with a strict
   function tool: it accumulates every chunk, checks the stream's shape and parses the tool's
   arguments against the schema (`parsed_arguments`).
"""

import asyncio
import sys

import pydantic
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

set_tracing_disabled(True)
base_url, api_key = sys.argv[1], sys.argv[2]
client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
model = OpenAIChatCompletionsModel(model="gpt-4.1", openai_client=client)


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    print(f"TOOL: get_weather {city}", flush=True)
    return f"sunny in {city}"


@function_tool
def get_time(city: str) -> str:
    """The local time in a city."""
    print(f"TOOL: get_time {city}", flush=True)
    return f"noon in {city}"


class Forecast(pydantic.BaseModel):
    city: str
    sunny: bool


class Lookup(pydantic.BaseModel):
    city: str


async def streamed_tools() -> None:
    agent = Agent(
        name="weather",
        instructions="Answer briefly.",
        tools=[get_weather, get_time],
        model=model,
        model_settings=ModelSettings(parallel_tool_calls=True),
    )
    run = Runner.run_streamed(agent, "Weather and time in Paris?")
    text = []
    async for event in run.stream_events():
        if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
            text.append(event.data.delta)
    print("STREAMED TEXT:", "".join(text), flush=True)
    print("STREAMED FINAL:", run.final_output, flush=True)


async def structured() -> None:
    agent = Agent(
        name="forecaster",
        instructions="Answer with the forecast.",
        model=model,
        output_type=Forecast,
    )
    result = await Runner.run(agent, "Is it sunny in Rome?")
    forecast = result.final_output
    print(f"STRUCTURED: {type(forecast).__name__} city={forecast.city} sunny={forecast.sunny}", flush=True)


async def sdk_stream_helper() -> None:
    from openai import pydantic_function_tool

    async with client.chat.completions.stream(
        model="gpt-4.1",
        messages=[{"role": "user", "content": "Look up Oslo."}],
        tools=[pydantic_function_tool(Lookup, name="lookup")],
    ) as stream:
        async for _ in stream:
            pass
        completion = await stream.get_final_completion()
    choice = completion.choices[0]
    call = choice.message.tool_calls[0]
    parsed = call.function.parsed_arguments
    print(
        f"HELPER: finish={choice.finish_reason} call={call.function.name} "
        f"parsed={type(parsed).__name__}({parsed.city})",
        flush=True,
    )


async def main() -> None:
    await streamed_tools()
    await structured()
    await sdk_stream_helper()


asyncio.run(main())
