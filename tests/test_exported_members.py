"""Every package's public names, pinned (httpx's ``test_exported_members``): a name that appears
or disappears from a facade is an API change, made on purpose and seen in review."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import mmfront

EXPORTED = {
    'mmfront': ['BaseMultiModalProcessor', 'EngineCoreRequest', 'InputPreprocessor', 'InputProcessor', 'MMFrontError', 'MediaWithBytes', 'MultiModalConfig', 'MultiModalFeatureSpec', 'MultiModalFieldConfig', 'MultiModalInputs', 'MultiModalKwargsItem', 'MultiModalKwargsItems', 'PlaceholderRange', 'RequestOptions', 'SamplingParams', '__version__', 'create_processor'],
    'mmfront.cache': ['BaseMultiModalCache', 'BaseMultiModalProcessorCache', 'BaseMultiModalReceiverCache', 'CacheInfo', 'LRUCache', 'LruKeyReplicatedReceiverCache', 'LruKeyReplicatedSenderCache', 'MirroredReceiverCache', 'MirroredSenderCache', 'MultiModalCacheStats', 'MultiModalProcessorOnlyCache', 'ShmObjectStoreReceiverCache', 'ShmObjectStoreSenderCache', 'cleanup_stale_segments', 'engine_receiver_cache_from_config', 'get_processor_cache_type', 'processor_cache_from_config', 'processor_only_cache_from_config', 'receiver_cache_from_config', 'worker_receiver_cache_from_config'],
    'mmfront.engine': ['AsyncEngineClient', 'BaseTransport', 'BlockingEngineClient', 'DataParallelConfig', 'EngineClient', 'EngineCoreReceiver', 'EngineInfo', 'EngineReceiver', 'FrontendHandshake', 'PipeTransport', 'RequestAdmitted', 'RequestFailed', 'RequestOutput', 'ZmqAddresses', 'ZmqEngineTransport', 'ZmqFrontendTransport', 'engine_handshake'],
    'mmfront.engine.transports': ['BaseTransport', 'ENGINE_TRANSPORTS', 'EngineTransportFactory', 'PipeTransport', 'ZmqAddresses', 'ZmqEngineTransport', 'ZmqFrontendTransport', 'engine_identity', 'zmq_engine_factory'],
    'mmfront.media': ['AudioWithRate', 'DecodeBudget', 'DecodedDataURL', 'HttpFetcher', 'ImageIOOptions', 'MediaConnector', 'MediaSource', 'VideoIOOptions', 'base64_length_fits', 'check_media_size', 'convert_image_mode', 'decode_base64', 'has_alpha', 'is_base64_header', 'is_domain_allowed', 'load_audio_bytes', 'load_image_bytes', 'load_video_bytes', 'normalize_pil_image', 'resample_audio', 'resampled_length', 'resolve_image_options', 'resolve_video_options'],
    'mmfront.models': ['BaseMultiModalProcessor', 'BaseProcessingInfo', 'ModelSpec', 'ProcessorFactory', 'ReferenceModel', 'create_processor', 'register_model', 'register_processor'],
    'mmfront.parse': ['AudioEmbeddingItems', 'AudioProcessorItems', 'EmbeddingItems', 'ImageEmbeddingItems', 'ImageProcessorItems', 'ImageSize', 'MediaWithBytes', 'ModalityDataItems', 'MultiModalDataItems', 'MultiModalDataParser', 'ProcessorBatchItems', 'VideoEmbeddingItems', 'VideoProcessorItems'],
    'mmfront.preprocess': ['InputPreprocessor', 'InputProcessor', 'ModelPipeline', 'PreparedRequest', 'PromptInput', 'RequestOptions'],
    'mmfront.processing': ['BaseDummyInputsBuilder', 'BaseMultiModalProcessor', 'BaseProcessingInfo', 'PlaceholderFeaturesInfo', 'PreparedInputs', 'PromptIndexTargets', 'PromptInsertion', 'PromptReplacement', 'PromptUpdate', 'PromptUpdateDetails', 'iter_token_matches'],
    'mmfront.processing.executors': ['BaseLaneExecutor', 'InPlaceExecutor', 'ItemExecutor', 'ItemJob', 'ItemProcessor', 'LaneSpec', 'LocalProcessExecutor', 'ProcessorOrigin', 'RayExecutor', 'executor_from_config'],
    'mmfront.serve.anthropic_messages': ['AnthropicCountTokensResponse', 'AnthropicMessagesResponse', 'AnthropicRoutes', 'AnthropicStreamEvent', 'AnthropicUsage', 'anthropic_usage', 'error_type', 'merges_inline_system', 'message_events', 'stop_reason', 'whole_message'],
    'mmfront.serve.anthropic_protocol': ['AnthropicCountTokensRequest', 'AnthropicMessagesRequest', 'BILLING_HEADER', 'ContentBlock', 'DisabledThinkingEffort', 'EFFORTS', 'Effort', 'ThinkingAdaptive', 'ThinkingDisabled', 'ThinkingEnabled', 'decode_anthropic', 'image_url', 'to_chat_request'],
    'mmfront.serve.api_servers': ['no_rejoin', 'serve_api_servers'],
    'mmfront.serve.app': ['create_app', 'error_response', 'json_response'],
    'mmfront.serve.args': ['DESCRIPTION', 'RoutedArgv', 'SERVE_FLAGS', 'ServeFlags', 'add_serve_parser', 'engine_kind', 'plan_from_args', 'refuse_unknown', 'route_serve_argv', 'serve_argv', 'serve_flag_table', 'unrouted_engine_flags'],
    'mmfront.serve.beam_search': ['Beam', 'BeamSearch', 'BeamSearchParams', 'answer', 'beam_score', 'beam_search_params', 'best_beams', 'end_of_sequence_ids', 'grow'],
    'mmfront.serve.errors': ['BODY_PARAM', 'ErrorInfo', 'ErrorResponse', 'MAX_ERROR_MESSAGE_CHARS', 'MAX_ERROR_PARAM_CHARS', 'VLLM_VALIDATION_CODE', 'engine_error', 'error_body', 'error_info', 'shortened'],
    'mmfront.serve.launcher': ['AccessLogFilter', 'ENGINE_DEATH_STATUS', 'ENGINE_KIND', 'ENGINE_NAME', 'EngineProcesses', 'EngineWatchdog', 'Frontend', 'GROUP_SETTLE_S', 'KEEP_ALIVE', 'LastingSpawner', 'Link', 'SPAWNER', 'WAIT_LOG_INTERVAL_S', 'bind_handshake', 'bind_link', 'check_start', 'client_over', 'engine_commands', 'engine_kind', 'engine_name', 'exit_on_sigterm', 'freeze_startup_heap', 'group_running', 'handshake_parallel', 'http_limits', 'http_sockets', 'keep_alive_on_engine_death', 'listening_socket', 'log_engine_exit', 'meet_engines', 'run_app', 'serve', 'show_logs', 'start_engines', 'start_frontend', 'uvicorn_config', 'worker_command'],
    'mmfront.serve.middleware': ['LoadCount', 'LoadTracker', 'RootPath', 'XRequestIdMiddleware', 'add_user_middleware'],
    'mmfront.serve.openapi': ['BODIES', 'TITLE', 'openapi_schema', 'redoc_page', 'routes', 'swagger_page'],
    'mmfront.serve.output': ['ChoiceOutput', 'Delta', 'IncrementalDetokenizer', 'LOGPROB_FLOOR', 'Logprob', 'LogprobTokens', 'PROMPT_PRIMING_TOKENS', 'PositionLogprobs', 'PromptLogprobs', 'WholeOutput', 'WindowDetokenizer', 'leading_space_marker', 'make_detokenizer', 'position_logprobs', 'prompt_logprobs', 'sample_logprobs'],
    'mmfront.serve.protocol': ['ChatCompletionNamedToolChoiceParam', 'ChatCompletionRequest', 'ChatCompletionToolsParam', 'CompletionRequest', 'Int64', 'JsonSchemaResponseFormat', 'LegacyStructuralTag', 'MAX_STOP_STRINGS', 'ResponseFormat', 'StreamOptions', 'continuous_usage', 'echoes_prompt_only', 'include_usage', 'named_tool', 'prompts', 'template_kwargs', 'template_tools'],
    'mmfront.serve.request_checks': ['MAX_COMPLETION_PROMPTS', 'MAX_REQUEST_ID_LENGTH', 'NOT_SUPPORTED', 'check_message_content', 'check_request', 'check_request_id', 'thinking_token_budget'],
    'mmfront.serve.request_decoding': ['MAX_JSON_DEPTH', 'check_nesting', 'decode_body', 'decode_chat_body', 'decode_request', 'fits'],
    'mmfront.serve.request_log': ['RequestLogger', 'logged_message', 'logger'],
    'mmfront.serve.responses': ['ChatCompletionLogProb', 'ChatCompletionLogProbs', 'ChatCompletionLogProbsContent', 'ChatCompletionResponse', 'ChatCompletionResponseChoice', 'ChatCompletionResponseStreamChoice', 'ChatCompletionStreamResponse', 'ChatMessage', 'CompletionLogProbs', 'CompletionResponse', 'CompletionResponseChoice', 'CompletionResponseStreamChoice', 'CompletionStreamResponse', 'CompletionTokenUsageInfo', 'DeltaFunctionCall', 'DeltaMessage', 'DeltaToolCall', 'ENCODER', 'FunctionCall', 'HTTPErrorResponse', 'LogprobFormat', 'ModelCard', 'ModelList', 'ModelPermission', 'OpenAIBody', 'PerRequestMetrics', 'PromptTokenUsageInfo', 'ResponseHead', 'ServerLoad', 'StreamPerRequestMetrics', 'TOKEN_ID_PREFIX', 'ToolCall', 'UnauthorizedResponse', 'UsageInfo', 'VersionResponse', 'chat_choice', 'chat_chunk', 'chat_echo_chunk', 'chat_logprobs', 'chat_response', 'chat_role_chunk', 'chat_top_logprobs_limit', 'chat_usage_chunk', 'clamp_prompt_logprobs', 'completion_choice', 'completion_chunk', 'completion_logprobs', 'completion_response', 'completion_top_logprobs_limit', 'completion_usage_chunk', 'model_card', 'per_request_metrics', 'usage'],
    'mmfront.serve.sampling': ['MAX_LOGPROB_TOKEN_IDS', 'MAX_NUM_BAD_WORDS', 'Vocabulary', 'check_logprobs', 'check_prompt_bounds', 'child_params', 'sampling_params', 'structured_outputs', 'verify_params'],
    'mmfront.serve.stats': ['FAMILIES', 'Family', 'LABEL_VALUES', 'ServerMetrics', 'request_tokens_buckets'],
    'mmfront.serve.server': ['SESSION_ID_HEADER', 'Server', 'base_id', 'cached_tokens', 'error_response', 'finished_weight_versions', 'id_header', 'json_response', 'top_logprobs'],
    'mmfront.serve.generation': ['Generation', 'QueueItem', 'Unanswered'],
    'mmfront.serve.chat_completions': ['ChatStream', 'PreparedChat', 'answer_chat', 'chat', 'chat_chunks', 'decode_chat', 'prepare_chat', 'prepare_chat_request', 'response_role'],
    'mmfront.serve.completions': ['completion_chunks', 'completions'],
    'mmfront.serve.event_stream': ['DisconnectWatch', 'EventStreamResponse', 'SSE_DONE', 'SSE_KEEP_ALIVE_COMMENT', 'event_stream_response', 'sse_event', 'with_sse_keep_alive'],
    'mmfront.serve.banner': ['DERIVED', 'SENSITIVE', 'engines_banner', 'listen_address', 'log_routes', 'log_version_and_args', 'logger', 'non_default_args'],
    'mmfront.serve.inline_media': ['LiftedBody', 'MIN_LIFTED_BYTES', 'lift_data_urls'],
    'mmfront.serve.iteration_stats': ['FinishedRequestStats', 'IterationStats', 'PerfStats', 'PrefillStats', 'PrefixCacheStats', 'PromptTokenStats', 'Recorder', 'RequestTimings', 'SchedulerStats', 'StatsRecorder', 'prefill_stats', 'scheduler_stats'],
    'mmfront.serve.stats_log': ['CachingMetrics', 'DEFAULT_INTERVAL_S', 'MultiModalCacheDelta', 'MultiModalCounts', 'StatsLog', 'kv_cache_device', 'log_stats_interval', 'logger'],
    'mmfront.serve.structured': ['BACKENDS', 'MAX_JSON_NESTING', 'PUBLIC_FIELDS', 'REGEX_COMPILATION_TIMEOUT_S', 'check_json_nesting', 'check_structural_tag', 'choice_as_grammar', 'grammar_is_likely_lark', 'resolve_backend', 'validate_guidance', 'validate_xgrammar'],
    'mmfront.serve.tokenize': ['DetokenizeRequest', 'DetokenizeResponse', 'TokenizeChatRequest', 'TokenizeCompletionRequest', 'TokenizeResponse', 'chat_options', 'decode_detokenize', 'decode_tokenize', 'detokenize', 'special_tokens_around', 'tokenize', 'tokenizer_info'],
    'mmfront.serve.vllm_engine': ['EngineKind', 'VLLM_CLI_CODE', 'VLLM_CLI_MODULE', 'VLLM_ENGINE_KIND', 'VLLM_ENGINE_NAME', 'script_python', 'tcp_host_port', 'vllm_cli', 'vllm_engine_command'],
    'mmfront.serve.vllm_flags': ['ENGINE_FLAGS', 'HEADLESS_MESSAGE', 'NOT_TAKEN_FRONTEND_FLAGS', 'PLACED_BY_THE_LAUNCHER', 'SHARED_SERVE_FLAGS', 'refusal'],
    'mmfront.wire': ['DEFAULT_SIZE_THRESHOLD', 'EngineCoreOutput', 'EngineCoreOutputs', 'EngineCoreRequest', 'FinishReason', 'Frame', 'LoRARequest', 'MsgpackDecoder', 'MsgpackEncoder', 'PoolingParams', 'RequestOutputKind', 'SamplingParams', 'frame_view', 'frame_views', 'tensor_bytes'],
}


@pytest.mark.parametrize("package", sorted(EXPORTED))
def test_all_is_pinned(package: str) -> None:
    assert sorted(importlib.import_module(package).__all__) == EXPORTED[package]


@pytest.mark.parametrize("package", sorted(EXPORTED))
def test_every_exported_name_is_defined_by_mmfront(package: str) -> None:
    module = importlib.import_module(package)
    for name in module.__all__:
        value = getattr(module, name)
        if inspect.isclass(value) or inspect.isfunction(value):  # not type aliases and constants
            assert value.__module__.startswith("mmfront"), f"{package}.{name} comes from {value.__module__}"


def test_internal_modules_carry_a_leading_underscore_and_are_not_exported() -> None:
    internal = {m.name for m in pkgutil.walk_packages(mmfront.__path__, "mmfront.") if m.name.rsplit(".", 1)[1].startswith("_")}
    assert {"mmfront.wire._tensors", "mmfront.cache._lrumap", "mmfront.cache._shm_ring",
            "mmfront.cache._shm_store", "mmfront.processing._matching", "mmfront._text"} <= internal
    for names in EXPORTED.values():
        assert not any(name.startswith("_") and name != "__version__" for name in names)
