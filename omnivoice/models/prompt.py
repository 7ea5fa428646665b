"""Turn chat messages (text and audio) into a thinker `Prompt`: token ids plus one log-mel matrix per audio.

The layout is Qwen3-Omni's chat template (`qwen3_omni_chat_template.jinja`), as transformers'
`apply_chat_template` and Qwen3OmniMoeProcessor render it:

    <|im_start|>system\n{text}<|im_end|>\n
    <|im_start|>user\n<|audio_start|><|audio_pad|>*N<|audio_end|>{text}<|im_end|>\n
    <|im_start|>user\n<|vision_start|><|image_pad|>*M<|vision_end|>{text}<|im_end|>\n
    <|im_start|>assistant\n{text}<|im_end|>\n
    <|im_start|>assistant\n                       <- generation prompt

With functions offered, the first system turn ends with a "# Tools" section listing them (one JSON
object per line inside <tools></tools>); an assistant turn's calls follow its text as
`<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`, and consecutive `tool` turns share one
user turn, each result inside <tool_response></tool_response>. A message's content counts as the
template's plain string when it holds no audio nor image (a multimodal list otherwise), which decides the
template's "last query" and so where an earlier assistant turn gets an empty <think></think> block.

Each run of text between control tokens is encoded on its own, which is exactly what the tokenizer does
to the rendered string (added tokens split the input before BPE). One difference on purpose: control
token strings typed inside message text (e.g. "<|im_end|>") are encoded as plain text, not as control
tokens, so a user cannot forge turns. The tool tags (`<tool_call>`, `<tool_response>`...) are plain
added tokens, not control tokens: in text they are the tag tokens, as in the template's rendering.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase, WhisperFeatureExtractor

from omnivoice.audio.log_mel import LogMel
from omnivoice.models.image_processor import (
    ImageError,
    ImageSettings,
    decode_rgb,
    image_patches,
    image_token_count,
    tokens_for_size,
)
from omnivoice.models.loader import ModelSpec
from omnivoice.types import AudioPart, ChatMessage, FunctionSpec, ImagePart, Prompt, PromptTooLong, TextPart

ROLES = ("system", "user", "assistant", "tool")
TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call>"
)


class PromptError(ValueError):
    """The messages cannot be turned into a prompt (empty, unknown role, bad or too long audio...)."""


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class PromptBuilder:
    """Builds thinker prompts in the checkpoint's chat format; one instance per loaded checkpoint."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        feature_extractor: WhisperFeatureExtractor,
        spec: ModelSpec,
        max_audio_seconds: float = 300.0,
        image_settings: ImageSettings | None = None,
    ) -> None:
        """`image_settings`: how images become vision patches (None: images are refused)."""
        if feature_extractor.sampling_rate != spec.input_sample_rate:
            raise ValueError(
                f"feature extractor runs at {feature_extractor.sampling_rate} Hz, "
                f"the audio encoder expects {spec.input_sample_rate} Hz"
            )
        if feature_extractor.feature_size != spec.num_mel_bins:
            raise ValueError(
                f"feature extractor makes {feature_extractor.feature_size} mel bins, "
                f"the audio encoder expects {spec.num_mel_bins}"
            )
        self._tokenizer = tokenizer
        self.log_mel = LogMel.of(feature_extractor)  # the clips' features (sessions extract with it too)
        self._spec = spec
        self._max_audio_seconds = max_audio_seconds
        self._image_settings = image_settings if spec.image_pad_id is not None else None
        self._role_ids = {"system": spec.system_id, "user": spec.user_id, "assistant": spec.assistant_id}
        # The most characters of text one token stands for. Byte-level BPE spells each byte of a token
        # as one character, and a character is at least a byte, so no token covers more characters than
        # its entry in the vocabulary has; control tokens are left out (never read from message text).
        vocab = tokenizer.backend_tokenizer.get_vocab(with_added_tokens=False)
        self.max_token_chars = max(map(len, vocab))

    def build(
        self,
        messages: Sequence[ChatMessage],
        default_system: str | None = None,
        tools: Sequence[FunctionSpec] = (),
        max_tokens: int | None = None,
    ) -> Prompt:
        """Tokenize `messages`, offering the model `tools`, and end with the assistant generation prompt.

        `default_system` is prepended as a system turn when the first message is not one.
        Raises PromptError on invalid input, PromptTooLong when the images' placeholder tokens alone
        (counted from their sizes, before any is decoded) exceed `max_tokens`.
        """
        if not messages:
            raise PromptError("no messages to build a prompt from")
        if default_system is not None and messages[0].role != "system":
            messages = [ChatMessage(role="system", parts=(TextPart(default_system),)), *messages]
        for index, message in enumerate(messages):
            self._check_message(index, message)
        self._check_image_tokens(messages, max_tokens)
        pieces: list[str | int] = []  # text to encode, or an already-known token id
        features: list[np.ndarray] = []
        images: list[tuple[np.ndarray, tuple[int, int, int]]] = []
        if tools:
            pieces += [self._spec.im_start_id, self._spec.system_id, "\n"]
            if messages[0].role == "system":
                pieces += [_text(messages[0]), "\n\n"]
            pieces += [TOOLS_HEAD, *[f"\n{_tool_json(t)}" for t in tools], TOOLS_TAIL]
            pieces += [self._spec.im_end_id, "\n"]
        last_query = _last_query(messages)
        for index, message in enumerate(messages):
            if index == 0 and message.role == "system" and tools:
                continue  # opened the tools section above
            if message.role == "assistant":
                last = index == len(messages) - 1
                pieces += self._assistant(message, think=index > last_query, last=last)
            elif message.role == "tool":
                pieces += self._tool(messages, index)
            else:
                pieces += [self._spec.im_start_id, self._role_ids[message.role], "\n"]
                pieces += self._content(index, message, features, images)
                pieces += [self._spec.im_end_id, "\n"]
        pieces += [self._spec.im_start_id, self._spec.assistant_id, "\n"]
        return Prompt(
            input_ids=tuple(self._encode(pieces)),
            audio_features=tuple(features),
            image_patches=tuple(p for p, _ in images),
            image_grids=tuple(g for _, g in images),
        )

    def _content(
        self,
        index: int,
        message: ChatMessage,
        features: list[np.ndarray],
        images: list[tuple[np.ndarray, tuple[int, int, int]]],
    ) -> list[str | int]:
        """A message's parts in order: text, and each audio's or image's placeholder run (its features
        or patches appended)."""
        pieces: list[str | int] = []
        for part in message.parts:
            if isinstance(part, TextPart):
                pieces.append(part.text)
                continue
            if isinstance(part, ImagePart):
                pieces += self._image(index, part, images)
                continue
            mel = self._log_mel(index, part) if part.features is None else self._given(index, part)
            features.append(mel)
            count = self._spec.audio_token_count(mel.shape[1])
            pieces += [self._spec.audio_start_id, *[self._spec.audio_pad_id] * count, self._spec.audio_end_id]
        return pieces

    def _image(
        self, index: int, part: ImagePart, images: list[tuple[np.ndarray, tuple[int, int, int]]]
    ) -> list[str | int]:
        settings, spec = self._image_settings, self._spec
        if settings is None or spec.image_pad_id is None or spec.vision_start_id is None:
            raise PromptError(f"message {index}: the served model takes no images")
        assert spec.vision_end_id is not None
        try:  # an encoded image is decoded here, its pixels dropped once patched
            rgb = part.rgb if part.rgb is not None else decode_rgb(part.data)
            patches, grid = image_patches(rgb, settings)
            del rgb
        except ImageError as e:
            raise PromptError(f"message {index}: {e}") from None
        images.append((patches, grid))
        count = image_token_count(grid, settings)
        return [spec.vision_start_id, *[spec.image_pad_id] * count, spec.vision_end_id]

    def _check_image_tokens(self, messages: Sequence[ChatMessage], max_tokens: int | None) -> None:
        """PromptTooLong if the images' placeholder tokens, from their sizes, exceed `max_tokens`."""
        parts = [p for m in messages for p in m.parts if isinstance(p, ImagePart)]
        if max_tokens is None or self._image_settings is None or not parts:
            return
        total = 0
        for part in parts:
            try:
                total += tokens_for_size(*part.shape, self._image_settings)
            except ImageError as e:
                raise PromptError(str(e)) from None
        if total > max_tokens:
            raise PromptTooLong(
                f"the images alone take {total} tokens of the prompt; the model's context is {max_tokens}"
            )

    def _assistant(self, message: ChatMessage, think: bool, last: bool) -> list[str | int]:
        """An assistant turn as the template writes it: a reasoning block only after the last query
        (when it is the final turn or has reasoning), then the text, then each call."""
        content, reasoning = _text(message), ""
        if "</think>" in content:
            reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
            content = content.split("</think>")[-1].lstrip("\n")
        if think and (last or reasoning):
            body = f"\n<think>\n{reasoning.strip(chr(10))}\n</think>\n\n{content.lstrip(chr(10))}"
        else:
            body = "\n" + content
        calls = [
            ("\n" if i or content else "")
            + f'<tool_call>\n{{"name": "{call.name}", "arguments": {call.arguments}}}\n</tool_call>'
            for i, call in enumerate(message.tool_calls)
        ]
        return [self._spec.im_start_id, self._spec.assistant_id, body, *calls, self._spec.im_end_id, "\n"]

    def _tool(self, messages: Sequence[ChatMessage], index: int) -> list[str | int]:
        """A function's result; consecutive results share one user turn."""
        pieces: list[str | int] = []
        if index == 0 or messages[index - 1].role != "tool":
            pieces += [self._spec.im_start_id, self._spec.user_id]
        pieces.append(f"\n<tool_response>\n{_text(messages[index])}\n</tool_response>")
        if index == len(messages) - 1 or messages[index + 1].role != "tool":
            pieces += [self._spec.im_end_id, "\n"]
        return pieces

    def _check_message(self, index: int, message: ChatMessage) -> None:
        if message.role not in ROLES:
            raise PromptError(f"message {index}: unsupported role {message.role!r}; use one of {ROLES}")
        if not message.parts and not message.tool_calls:
            raise PromptError(f"message {index} ({message.role}) has no content")
        if message.tool_calls and message.role != "assistant":
            raise PromptError(f"message {index}: only assistant messages make tool calls")
        for part in message.parts:
            if isinstance(part, AudioPart | ImagePart):
                if message.role != "user":
                    # Assistant turns are replayed as their text transcript; system turns are text only.
                    kind = "audio is" if isinstance(part, AudioPart) else "images are"
                    raise PromptError(f"message {index}: {kind} only accepted in user messages")
            elif not isinstance(part, TextPart):
                raise PromptError(f"message {index}: unsupported content part {type(part).__name__}")
            elif not _is_unicode(part.text):  # JSON's "\ud800" decodes to one; the tokenizer raises on it
                raise PromptError(f"message {index}: the text is not valid Unicode (a lone surrogate)")
        for call in message.tool_calls:
            if not _is_unicode(call.name + call.arguments):
                raise PromptError(f"message {index}: a tool call is not valid Unicode (a lone surrogate)")

    def _encode(self, pieces: list[str | int]) -> list[int]:
        """Encode each maximal run of text pieces as one string; ids pass through."""
        ids: list[int] = []
        run: list[str] = []
        for piece in [*pieces, None]:
            if isinstance(piece, str):
                run.append(piece)
                continue
            if run:
                text = "".join(run)
                ids += self._tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
                run = []
            if piece is not None:
                ids.append(piece)
        return ids

    def _given(self, index: int, part: AudioPart) -> np.ndarray:
        mel = part.features
        assert mel is not None
        if (
            mel.dtype != np.float32
            or mel.ndim != 2
            or mel.shape[0] != self._spec.num_mel_bins
            or not mel.shape[1]
        ):
            raise PromptError(
                f"message {index}: audio features must be float32 [{self._spec.num_mel_bins}, frames]"
            )
        return mel

    def _log_mel(self, index: int, part: AudioPart) -> np.ndarray:
        """Log-mel features [n_mels, frames] float32, trimmed to the audio's real length.

        Each audio is featurized on its own, as the processor does for a single clip: the feature
        extractor pads a batch to its longest clip, which would change the last frames of shorter
        clips (and so a clip's features would depend on the other clips in the conversation).
        """
        pcm = np.asarray(part.pcm, dtype=np.float32)
        if pcm.ndim != 1:
            raise PromptError(f"message {index}: audio must be mono 1-D PCM, got shape {pcm.shape}")
        if part.sample_rate <= 0:
            raise PromptError(f"message {index}: invalid audio sample rate {part.sample_rate}")
        if pcm.size == 0:
            raise PromptError(f"message {index}: audio is empty")
        seconds = pcm.size / part.sample_rate
        if seconds > self._max_audio_seconds:
            raise PromptError(
                f"message {index}: audio is {seconds:.1f} s long; the limit is {self._max_audio_seconds:g} s"
            )
        if not np.isfinite(pcm).all():
            raise PromptError(f"message {index}: audio contains NaN or infinite samples")
        rate = self._spec.input_sample_rate
        if part.sample_rate != rate:
            import soxr  # lazily: the GPU image has no soxr, and token-id prompts never resample

            pcm = soxr.resample(pcm, part.sample_rate, rate).astype(np.float32, copy=False)
        if pcm.size < self.log_mel.min_samples:
            raise PromptError(f"message {index}: audio is shorter than one feature frame ({seconds:.4f} s)")
        return self.log_mel(pcm)  # the feature extractor's math, unpadded


def _text(message: ChatMessage) -> str:
    return "".join(p.text for p in message.parts if isinstance(p, TextPart))


def _tool_json(tool: FunctionSpec) -> str:
    """A function as the template's `tool | tojson` writes the OpenAI tool object."""
    function: dict = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    if tool.parameters is not None:
        function["parameters"] = tool.parameters
    try:
        return json.dumps({"type": "function", "function": function}, ensure_ascii=False)
    except (TypeError, ValueError) as e:
        raise PromptError(f"tool {tool.name!r}: parameters are not JSON: {e}") from None


def _last_query(messages: Sequence[ChatMessage]) -> int:
    """The template's last query: the last user turn of plain-string content (no audio nor image) that
    is not a wrapped tool response; the last message's index when there is none."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.role != "user" or any(isinstance(p, AudioPart | ImagePart) for p in message.parts):
            continue
        text = _text(message)
        if not (text.startswith("<tool_response>") and text.endswith("</tool_response>")):
            return index
    return len(messages) - 1


def audio_inputs(prompt: Prompt) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The prompt's audio as Qwen3OmniMoeProcessor hands it to the model, or None without audio.

    Returns input_features [num_audios, n_mels, max_frames] float32 (zero-padded on the right) and
    feature_attention_mask [num_audios, max_frames] int64 (1 on real frames).
    """
    if not prompt.audio_features:
        return None
    lengths = [mel.shape[1] for mel in prompt.audio_features]
    n_mels = prompt.audio_features[0].shape[0]
    features = torch.zeros(len(lengths), n_mels, max(lengths), dtype=torch.float32)
    mask = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for row, mel in enumerate(prompt.audio_features):
        features[row, :, : mel.shape[1]] = torch.from_numpy(mel)
        mask[row, : mel.shape[1]] = 1
    return features, mask
