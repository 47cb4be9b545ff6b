"""The OpenAI Agents SDK (PyPI `openai-agents`, pinned in .ci/run) through `gyre proxy`.

Usage: python openai_agents_chain.py OPENAI_BASE_URL API_KEY

One run with a function tool and `auto_previous_response_id=True` (the SDK continues each
response with `previous_response_id` and sends only the new items: the tool's output), then a
second run continuing the first with `previous_response_id`. Prints each run's final output.
"""

import asyncio
import sys

from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

set_tracing_disabled(True)
base_url, api_key = sys.argv[1], sys.argv[2]
client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


agent = Agent(
    name="weather",
    instructions="Answer briefly.",
    tools=[get_weather],
    model=OpenAIResponsesModel(model="gpt-5.5", openai_client=client),
)


async def main() -> None:
    first = await Runner.run(
        agent, "What is the weather in Paris?", auto_previous_response_id=True
    )
    print("FIRST:", first.final_output)
    second = await Runner.run(agent, "Thanks!", previous_response_id=first.last_response_id)
    print("SECOND:", second.final_output)


asyncio.run(main())
