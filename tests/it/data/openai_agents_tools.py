"""The OpenAI Agents SDK's typed client-run tools through `gyre proxy`.

Usage: python openai_agents_tools.py OPENAI_BASE_URL API_KEY WORKDIR

One run of an agent with the SDK's `ShellTool` (a local executor that runs each command with
`sh -c` in WORKDIR) and `ApplyPatchTool` (an editor that applies the V4A diff to files in
WORKDIR with the SDK's own `apply_diff`). The SDK sends the whole conversation each turn,
its own `shell_call_output` and `apply_patch_call_output` items included. Prints each
command it ran, each file operation, and the final output.
"""

import asyncio
import pathlib
import subprocess
import sys

from agents import Agent, ApplyPatchTool, OpenAIResponsesModel, Runner, ShellTool
from agents import set_tracing_disabled
from agents.apply_diff import apply_diff
from agents.editor import ApplyPatchOperation, ApplyPatchResult
from agents.tool import ShellCallOutcome, ShellCommandOutput, ShellCommandRequest, ShellResult
from openai import AsyncOpenAI

set_tracing_disabled(True)
base_url, api_key, workdir = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)


def run_commands(request: ShellCommandRequest) -> ShellResult:
    outputs = []
    for command in request.data.action.commands:
        print("SHELL:", command, flush=True)
        done = subprocess.run(
            ["sh", "-c", command], cwd=workdir, capture_output=True, text=True, timeout=30
        )
        # A failed command says its exit code; a successful one leaves the SDK's default
        # outcome, an exit without a code (sent as `"exit_code": null`).
        outcome = (
            ShellCallOutcome(type="exit", exit_code=done.returncode)
            if done.returncode
            else ShellCallOutcome(type="exit")
        )
        outputs.append(
            ShellCommandOutput(
                stdout=done.stdout, stderr=done.stderr, outcome=outcome, command=command
            )
        )
    return ShellResult(output=outputs)


class Editor:
    def create_file(self, operation: ApplyPatchOperation) -> ApplyPatchResult:
        print("CREATE:", operation.path, flush=True)
        text = apply_diff("", operation.diff or "", mode="create")
        (workdir / operation.path).write_text(text)
        return ApplyPatchResult(status="completed", output=f"created {operation.path}")

    def update_file(self, operation: ApplyPatchOperation) -> ApplyPatchResult:
        print("UPDATE:", operation.path, flush=True)
        target = workdir / operation.path
        target.write_text(apply_diff(target.read_text(), operation.diff or ""))
        return ApplyPatchResult(status="completed", output=f"updated {operation.path}")

    def delete_file(self, operation: ApplyPatchOperation) -> ApplyPatchResult:
        print("DELETE:", operation.path, flush=True)
        (workdir / operation.path).unlink()
        return ApplyPatchResult(status="completed", output=f"deleted {operation.path}")


agent = Agent(
    name="coder",
    instructions="Work in the repository.",
    tools=[ShellTool(executor=run_commands), ApplyPatchTool(editor=Editor())],
    model=OpenAIResponsesModel(model="gpt-5.5", openai_client=client),
)


async def main() -> None:
    result = await Runner.run(agent, "Copy the greeting into b.txt and capitalise it.")
    print("FINAL:", result.final_output)


asyncio.run(main())
