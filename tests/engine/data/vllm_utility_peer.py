"""vLLM 0.33's own codec on utility calls and their answers, run by tests/engine/test_utility.py in
the vLLM peer venv.

    python vllm_utility_peer.py < request.json

Reads ``{"call": [hex frames], "answer": [hex frames]}``: the frames of an mmfront utility call as
vLLM's engine receives them (after the type frame), and the frames of an mmfront engine's answer as
vLLM's frontend receives them. Decodes the call as ``EngineCoreProc``'s input thread does (the
generic decoder) and the answer as a frontend does (``MsgpackDecoder(EngineCoreOutputs)``), and
encodes vLLM's own answer to a ``get_supported_tasks`` call (call id 7). Prints one JSON document.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    from vllm.v1.engine import EngineCoreOutputs, UtilityOutput, UtilityResult
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    given = json.load(sys.stdin)
    call = MsgpackDecoder().decode([bytes.fromhex(f) for f in given["call"]])
    answer = MsgpackDecoder(EngineCoreOutputs).decode([bytes.fromhex(f) for f in given["answer"]]).utility_output
    own = MsgpackEncoder().encode(EngineCoreOutputs(utility_output=UtilityOutput(7, result=UtilityResult(("generate",)))))
    print(json.dumps({
        "call": list(call),
        "answer": [answer.call_id, answer.failure_message, answer.result.result],
        "vllm_answer": [bytes(memoryview(f).cast("B")).hex() for f in own],
    }))


if __name__ == "__main__":
    main()
