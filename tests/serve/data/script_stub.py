"""A stub vLLM 0.33 executor (vLLM venv) that answers with text the request itself scripts.

The last ``<<<...>>>`` in a request's prompt is its answer (``<<<ECHO>>>``: the prompt itself):
its tokens, one per step, then ``<eos>`` (so the request stops on its own, finish reason ``stop``). A prompt without a script
gets the plain stub's tokens (``../shared/peer/stub_executor.py``, which this extends: put that
folder and this one on ``PYTHONPATH`` and pass ``--distributed-executor-backend
script_stub.ScriptStubExecutor``). It lets a test choose what a model "says" - tool calls,
reasoning - and compare what two servers make of it.

Each new request's structured-outputs constraint, as the engine decoded it from the server's
``EngineCoreRequest``, is printed on the engine's stdout (one ``STRUCTURED_OUTPUTS {json}`` line,
every field of vLLM's ``StructuredOutputsParams``), so a test compares what each server sent.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from stub_executor import StubExecutor
from tokenizers import Tokenizer
from vllm.v1.outputs import ModelRunnerOutput

_SCRIPT = re.compile(r"<<<(.*)>>>", re.DOTALL)


class ScriptStubExecutor(StubExecutor):
    def _init_executor(self) -> None:
        super()._init_executor()
        self._tokenizer = Tokenizer.from_file(str(Path(self.model_config.tokenizer) / "tokenizer.json"))
        self._eos = self._tokenizer.token_to_id("<eos>")
        self._scripts: dict[str, list[int]] = {}

    def _step(self, so) -> ModelRunnerOutput:
        for nr in so.scheduled_new_reqs:
            constraint = nr.sampling_params.structured_outputs if nr.sampling_params is not None else None
            if constraint is not None:
                fields = {f.name: getattr(constraint, f.name) for f in dataclasses.fields(constraint)}
                print("STRUCTURED_OUTPUTS " + json.dumps(fields), flush=True)
            prompt = self._tokenizer.decode(list(nr.prompt_token_ids or []), skip_special_tokens=False)
            found = [m.group(1) for m in _SCRIPT.finditer(prompt)]
            if found:
                ids = (list(nr.prompt_token_ids or []) if found[-1] == "ECHO"
                       else self._tokenizer.encode(found[-1], add_special_tokens=False).ids)
                self._scripts[nr.req_id] = [*ids, self._eos]
        out = super()._step(so)
        sampled = []
        for rid, tokens in zip(out.req_ids, out.sampled_token_ids):
            script = self._scripts.get(rid)
            if script is None or not tokens:
                sampled.append(tokens)
                continue
            k = self._reqs[rid]["generated"] - 1
            sampled.append([script[k] if k < len(script) else self._eos])
        for rid in so.finished_req_ids:
            self._scripts.pop(rid, None)
        return ModelRunnerOutput(req_ids=out.req_ids, req_id_to_index=out.req_id_to_index, sampled_token_ids=sampled)
