"""The response bodies, byte for byte as vLLM writes them: every field of a whole response,
``null`` included, in vLLM's order; on a stream chunk only the fields vLLM sets on it (the role
chunk's ``prompt_*``, a content chunk's ``token_ids`` and ``kv_transfer_params``, the finishing
chunk's ``stop_reason``, ``weight_versions`` and fingerprint); the usage of a whole response,
of a chat chunk and of other chunks; both logprob shapes with ``-inf`` floored; ``/v1/models``.
The bytes were recorded from the hand-built dicts these structs replaced."""

from __future__ import annotations

from mmfront.serve import responses
from mmfront.serve.output import Logprob
from mmfront.serve.responses import ENCODER, LogprobFormat, ResponseHead

HEAD = ResponseHead("chatcmpl-1", 5, "m", "fp")


def decode(token_id: int) -> str:
    return f"t{token_id}\u00e9"


TOKENS = [3, 5]
POSITIONS: list[dict[int, Logprob] | None] = [
    {3: Logprob(-0.5, 1, decode(3)), 4: Logprob(float("-inf"), 2, decode(4))},
    {5: Logprob(float("-inf"), 1, decode(5)), 6: Logprob(-1e9, 2, decode(6))}]


def chat_logprobs() -> responses.ChatCompletionLogProbs:
    return responses.chat_logprobs(TOKENS, POSITIONS, 2, LogprobFormat(decode))


def completion_logprobs() -> responses.CompletionLogProbs:
    return responses.completion_logprobs(TOKENS, POSITIONS, 0, LogprobFormat(decode), 7)


def test_usage_of_a_response_a_chat_chunk_and_other_chunks() -> None:
    assert ENCODER.encode(responses.usage(3, 4)) == b'{"prompt_tokens":3,"total_tokens":7,"completion_tokens":4,"prompt_tokens_details":null,"completion_tokens_details":null}'
    assert ENCODER.encode(responses.usage(3, 4, details=False, completion_details=True)) == (
        b'{"prompt_tokens":3,"total_tokens":7,"completion_tokens":4,"completion_tokens_details":null}')
    assert ENCODER.encode(responses.usage(3, 4, details=False)) == b'{"prompt_tokens":3,"total_tokens":7,"completion_tokens":4}'


def test_chat_response() -> None:
    body = responses.chat_response(HEAD, [responses.chat_choice(0, "hi", chat_logprobs(), "stop", None),
                                          responses.chat_choice(1, "x", None, "length", 7)], responses.usage(3, 4))
    assert ENCODER.encode(body) == b'{"id":"chatcmpl-1","object":"chat.completion","created":5,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi","refusal":null,"annotations":null,"audio":null,"function_call":null,"reasoning":null},"logprobs":{"content":[{"token":"t3\xc3\xa9","logprob":-0.5,"bytes":[116,51,195,169],"top_logprobs":[{"token":"t3\xc3\xa9","logprob":-0.5,"bytes":[116,51,195,169]},{"token":"t4\xc3\xa9","logprob":-9999.0,"bytes":[116,52,195,169]}]},{"token":"t5\xc3\xa9","logprob":-9999.0,"bytes":[116,53,195,169],"top_logprobs":[{"token":"t5\xc3\xa9","logprob":-9999.0,"bytes":[116,53,195,169]},{"token":"t6\xc3\xa9","logprob":-9999.0,"bytes":[116,54,195,169]}]}]},"finish_reason":"stop","stop_reason":null,"token_ids":null,"routed_experts":null,"weight_versions":null},{"index":1,"message":{"role":"assistant","content":"x","refusal":null,"annotations":null,"audio":null,"function_call":null,"reasoning":null},"logprobs":null,"finish_reason":"length","stop_reason":7,"token_ids":null,"routed_experts":null,"weight_versions":null}],"service_tier":null,"system_fingerprint":"fp","usage":{"prompt_tokens":3,"total_tokens":7,"completion_tokens":4,"prompt_tokens_details":null,"completion_tokens_details":null},"prompt_logprobs":null,"prompt_token_ids":null,"prompt_text":null,"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}'


def test_completion_response() -> None:
    body = responses.completion_response(HEAD, [responses.completion_choice(0, "hi", completion_logprobs(), "stop", "s"),
                                                responses.completion_choice(1, "", None, None, None)],
                                         responses.usage(3, 4))
    assert ENCODER.encode(body) == b'{"id":"chatcmpl-1","object":"text_completion","created":5,"model":"m","choices":[{"index":0,"text":"hi","logprobs":{"text_offset":[7,10],"token_logprobs":[-0.5,-9999.0],"tokens":["t3\xc3\xa9","t5\xc3\xa9"],"top_logprobs":[{"t3\xc3\xa9":-0.5},{"t5\xc3\xa9":-9999.0}]},"finish_reason":"stop","stop_reason":"s","token_ids":null,"prompt_logprobs":null,"prompt_token_ids":null,"routed_experts":null,"weight_versions":null},{"index":1,"text":"","logprobs":null,"finish_reason":null,"stop_reason":null,"token_ids":null,"prompt_logprobs":null,"prompt_token_ids":null,"routed_experts":null,"weight_versions":null}],"service_tier":null,"system_fingerprint":"fp","usage":{"prompt_tokens":3,"total_tokens":7,"completion_tokens":4,"prompt_tokens_details":null,"completion_tokens_details":null},"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}'


def test_chat_chunks_carry_the_fields_vllm_sets_on_each() -> None:
    running = responses.usage(3, 0, details=False, completion_details=True)
    assert ENCODER.encode(responses.chat_role_chunk(HEAD, 1)) == b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":5,"model":"m","choices":[{"index":1,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}'
    assert ENCODER.encode(responses.chat_role_chunk(HEAD, 0, running)) == b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":5,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":3,"total_tokens":3,"completion_tokens":0,"completion_tokens_details":null},"prompt_token_ids":null,"prompt_text":null}'
    middle = responses.chat_chunk(HEAD, 0, "a", logprobs=chat_logprobs(), finish_reason=None, stop_reason=None,
                                  fingerprint=True)
    assert ENCODER.encode(middle) == b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":5,"model":"m","choices":[{"index":0,"delta":{"content":"a"},"logprobs":{"content":[{"token":"t3\xc3\xa9","logprob":-0.5,"bytes":[116,51,195,169],"top_logprobs":[{"token":"t3\xc3\xa9","logprob":-0.5,"bytes":[116,51,195,169]},{"token":"t4\xc3\xa9","logprob":-9999.0,"bytes":[116,52,195,169]}]},{"token":"t5\xc3\xa9","logprob":-9999.0,"bytes":[116,53,195,169],"top_logprobs":[{"token":"t5\xc3\xa9","logprob":-9999.0,"bytes":[116,53,195,169]},{"token":"t6\xc3\xa9","logprob":-9999.0,"bytes":[116,54,195,169]}]}]},"finish_reason":null,"token_ids":null}],"kv_transfer_params":null}'
    last = responses.chat_chunk(HEAD, 0, None, logprobs=None, finish_reason="stop", stop_reason=3, fingerprint=True)
    assert ENCODER.encode(last) == b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":5,"model":"m","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":3,"token_ids":null,"weight_versions":null}],"system_fingerprint":"fp","kv_transfer_params":null}'
    usage_so_far = responses.usage(1, 2, details=False, completion_details=True)
    no_fingerprint = responses.chat_chunk(HEAD, 2, "z", logprobs=None, finish_reason="length", stop_reason=None,
                                          fingerprint=False, usage_info=usage_so_far)
    assert ENCODER.encode(no_fingerprint) == b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":5,"model":"m","choices":[{"index":2,"delta":{"content":"z"},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null,"weight_versions":null}],"usage":{"prompt_tokens":1,"total_tokens":3,"completion_tokens":2,"completion_tokens_details":null},"kv_transfer_params":null}'
    usage = responses.usage(3, 4, details=False)
    assert ENCODER.encode(responses.chat_usage_chunk(HEAD, usage)) == b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":5,"model":"m","choices":[],"usage":{"prompt_tokens":3,"total_tokens":7,"completion_tokens":4},"system_fingerprint":"fp"}'


def test_completion_chunks_carry_the_fields_vllm_sets_on_each() -> None:
    middle = responses.completion_chunk(HEAD, 0, "a", logprobs=completion_logprobs(), finish_reason=None,
                                        stop_reason=None, fingerprint=True)
    assert ENCODER.encode(middle) == b'{"id":"chatcmpl-1","object":"text_completion","created":5,"model":"m","choices":[{"index":0,"text":"a","logprobs":{"text_offset":[7,10],"token_logprobs":[-0.5,-9999.0],"tokens":["t3\xc3\xa9","t5\xc3\xa9"],"top_logprobs":[{"t3\xc3\xa9":-0.5},{"t5\xc3\xa9":-9999.0}]},"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":null,"weight_versions":null}],"kv_transfer_params":null}'
    last = responses.completion_chunk(HEAD, 1, "", logprobs=None, finish_reason="stop", stop_reason="x",
                                      fingerprint=True, usage_info=responses.usage(1, 2, details=False))
    assert ENCODER.encode(last) == b'{"id":"chatcmpl-1","object":"text_completion","created":5,"model":"m","choices":[{"index":1,"text":"","logprobs":null,"finish_reason":"stop","stop_reason":"x","prompt_token_ids":null,"token_ids":null,"weight_versions":null}],"usage":{"prompt_tokens":1,"total_tokens":3,"completion_tokens":2},"system_fingerprint":"fp","kv_transfer_params":null}'
    no_fingerprint = responses.completion_chunk(HEAD, 1, "q", logprobs=None, finish_reason="stop", stop_reason=None,
                                                fingerprint=False)
    assert ENCODER.encode(no_fingerprint) == b'{"id":"chatcmpl-1","object":"text_completion","created":5,"model":"m","choices":[{"index":1,"text":"q","logprobs":null,"finish_reason":"stop","stop_reason":null,"prompt_token_ids":null,"token_ids":null,"weight_versions":null}],"kv_transfer_params":null}'
    usage = responses.usage(3, 4, details=False)
    assert ENCODER.encode(responses.completion_usage_chunk(HEAD, usage)) == b'{"id":"chatcmpl-1","object":"text_completion","created":5,"model":"m","choices":[],"usage":{"prompt_tokens":3,"total_tokens":7,"completion_tokens":4},"system_fingerprint":"fp"}'


def test_model_list() -> None:
    cards = [responses.model_card("m", "/root", 5, 100, "modelperm-ab"),
             responses.model_card("n", "/root", 5, None, "modelperm-cd")]
    assert ENCODER.encode(responses.ModelList(data=cards)) == b'{"object":"list","data":[{"id":"m","object":"model","created":5,"owned_by":"vllm","root":"/root","parent":null,"max_model_len":100,"permission":[{"id":"modelperm-ab","object":"model_permission","created":5,"allow_create_engine":false,"allow_sampling":true,"allow_logprobs":true,"allow_search_indices":false,"allow_view":true,"allow_fine_tuning":false,"organization":"*","group":null,"is_blocking":false}]},{"id":"n","object":"model","created":5,"owned_by":"vllm","root":"/root","parent":null,"max_model_len":null,"permission":[{"id":"modelperm-cd","object":"model_permission","created":5,"allow_create_engine":false,"allow_sampling":true,"allow_logprobs":true,"allow_search_indices":false,"allow_view":true,"allow_fine_tuning":false,"organization":"*","group":null,"is_blocking":false}]}]}'
