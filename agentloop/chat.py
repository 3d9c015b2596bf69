"""TokenBuilder: chat messages to token ids with the model's chat template, token-exactly.

The prompt is rendered and encoded once. After that the builder never re-tokenizes what the model
produced: sampled ids are appended untouched by the rollout loop, and each observation is appended
as the template's *token-level suffix* — the text the template adds for the new messages, encoded
on its own. Whether a template allows this is checked once, when the builder is made, with probe
conversations (see :meth:`TokenBuilder._probe_template`). A template that rewrites earlier turns
(not prefix-stable; Qwen3- and R1-style templates drop earlier turns' ``<think>`` blocks) needs a
declared thinking-history policy (``thinking``, set by ``rollout.thinking``): ``keep`` appends
observation suffixes after the sampled ids as for any template, so earlier reasoning stays in the
prompt; ``strip`` makes the rollout loop re-render the whole history before each turn and train
each turn as its own sample. Undeclared, such a template is rejected with :class:`TemplateError`
when the builder is made, instead of silently drifting.

With a :class:`~agentloop.vision.VisionProcessor`, messages may carry images: the template renders
one ``<|image_pad|>`` per image and the builder expands it, in token space, to the image's
placeholder run (the text-only path is unchanged).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any

from agentloop.errors import TemplateError
from agentloop.segments import SegmentEncoder
from agentloop.thinking import Thinking, check_thinking, require_policy
from agentloop.types import Message

if TYPE_CHECKING:
    from agentloop.vision import VisionProcessor

__all__ = ["TokenBuilder"]

_PROBE = "AGENTLOOP_PROBE_7f3c"
_SLOT = "\x1eAGENTLOOP_SLOT_{}\x1e"
_MAX_SHAPES = 1024
_UNLEARNED: Any = object()
_NO_VISION = (
    "messages carry {} image(s) but the TokenBuilder has no vision processor; pass "
    "vision=agentloop.vision.VisionProcessor.from_pretrained(model_dir)"
)
_THINK_PROBE = Message("assistant", f"<think>\nprobe reasoning\n</think>\n\n{_PROBE}")
_PROBE_MESSAGES = (
    Message("system", "probe system"),
    Message("user", "probe user"),
    Message("assistant", _PROBE),
)


class TokenBuilder:
    """Encodes prompts and observation suffixes for one tokenizer + chat template + tool list.

    ``tokenizer`` is a Hugging Face tokenizer. ``tools`` are OpenAI-style function schemas
    rendered into the system turn by templates that support them. ``chat_template`` overrides the
    tokenizer's own template. ``template_kwargs`` go to the template (e.g. ``enable_thinking``).
    ``vision`` (for VLMs) expands image placeholders; ``banned_token_ids`` are then the vision
    tokens, which the rollout asks engines never to sample.

    ``thinking`` is the declared thinking-history policy (``rollout.thinking``), needed only by
    a template that rewrites history (``rewrites_history`` says how, else None): ``auto``
    rejects such a template here, naming it and the policies that work; ``keep`` keeps earlier
    turns' reasoning in the prompt (one prefix-stable trajectory; only for templates whose one
    rewrite is dropping ``<think>`` blocks); ``strip`` shows the model the template's own
    rendering each turn (``splits_turns``: the rollout loop makes one sample per turn).
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        vision: VisionProcessor | None = None,
        thinking: str = "auto",
    ) -> None:
        check_thinking(thinking)
        template = chat_template or getattr(tokenizer, "chat_template", None)
        if not template or not isinstance(template, str):
            raise TemplateError(
                "the tokenizer has no chat template; pass chat_template=<jinja string> or use a "
                "tokenizer saved with one (tokenizer.chat_template)"
            )
        self.tokenizer = tokenizer
        self.chat_template = template
        self.tools = [dict(t) for t in tools] if tools else None
        self._template_kwargs = dict(template_kwargs or {})
        self._kwargs = {**tokenizer.special_tokens_map, **self._template_kwargs}
        self.stop_token_ids = _stop_token_ids(tokenizer)
        self._stop_texts = {i: tokenizer.convert_ids_to_tokens(i) for i in self.stop_token_ids}
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self._segments = SegmentEncoder.for_tokenizer(tokenizer)
        self.vision = vision
        self.banned_token_ids: tuple[int, ...] = vision.tokens.banned if vision else ()
        self._fragments: dict[tuple[Any, ...], Any] = {}
        self._probe_text = self.render(
            _PROBE_MESSAGES, add_generation_prompt=False, with_tools=False
        )
        self.thinking: Thinking = thinking  # type: ignore[assignment]  # checked above
        self._assistant_close, self.rewrites_history = self._probe_template()
        self.splits_turns = self.rewrites_history is not None and thinking == "strip"
        if self.rewrites_history is not None:
            require_policy(self.tokenizer, self.chat_template, self.rewrites_history, thinking)

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        """Pickled as its arguments and built again where it lands (a loop worker process):
        its caches hold functions local to the tokenizer."""
        rebuild = partial(
            TokenBuilder,
            self.tokenizer,
            tools=self.tools,
            chat_template=self.chat_template,
            template_kwargs=self._template_kwargs,
            vision=self.vision,
            thinking=self.thinking,
        )
        return rebuild, ()

    # -- rendering -------------------------------------------------------------------------

    def render(
        self, messages: Sequence[Message], *, add_generation_prompt: bool, with_tools: bool = True
    ) -> str:
        """The template's text for ``messages``, as ``apply_chat_template(tokenize=False)``."""
        from transformers.utils.chat_template_utils import render_jinja_template

        try:
            rendered, _ = render_jinja_template(  # type: ignore[str-unpack]
                conversations=[[m.to_template_dict() for m in messages]],
                tools=self.tools if with_tools else None,  # type: ignore[arg-type]
                chat_template=self.chat_template,
                add_generation_prompt=add_generation_prompt,
                **self._kwargs,
            )
        except Exception as exc:  # jinja errors, raise_exception() in templates
            roles = [m.role for m in messages]
            raise TemplateError(f"chat template failed on roles {roles}: {exc}") from exc
        return str(rendered[0])

    def encode(self, text: str) -> list[int]:
        """Encode template text; special tokens in the text map to their ids, nothing is added."""
        if self._segments is not None:  # repeated pieces (system prompt, tools) from a cache
            return self._segments.encode(text)
        if self._backend is not None:  # the Rust tokenizer directly: same ids, less overhead
            return list(self._backend.encode(text, add_special_tokens=False).ids)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        """Decode sampled ids to the text stored as the assistant message content."""
        ids = list(token_ids)
        if ids and ids[-1] in self._stop_texts:
            ids = ids[:-1]
        if self._backend is not None:
            return str(self._backend.decode(ids, skip_special_tokens=False))
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    @cached_property
    def max_token_chars(self) -> int:
        """The most characters one token spells: the longest vocabulary entry (a byte-level
        entry's length counts its bytes, which is at least its characters). A text of more than
        ``n * max_token_chars`` characters cannot fit in ``n`` tokens, so huge tool outputs are
        cut by characters before any tokenizing (:func:`~agentloop.tools.truncate_to_tokens`)."""
        return max(1, max(map(len, self.tokenizer.get_vocab()), default=1))

    # -- the two operations the rollout loop needs -----------------------------------------

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """Ids of the initial prompt, ending with the assistant generation prompt."""
        return self.encode_text(self.prompt_text(messages), messages)

    def encode_text(self, text: str, messages: Sequence[Message]) -> list[int]:
        """Encode ``text`` rendered from ``messages``, their images' placeholders expanded."""
        return self._expand(self.encode(text), messages)

    def prompt_text(self, messages: Sequence[Message]) -> str:
        """The text :meth:`prompt_ids` encodes (to size a prompt before tokenizing it)."""
        if any(m.role == "assistant" for m in messages):
            # templates branch on assistant content (reasoning blocks): always render those
            return self._render_prompt(messages)
        return self._filled("prompt", messages, self._render_prompt)

    def observation_ids(
        self, observation: Sequence[Message], completion_ids: Sequence[int]
    ) -> list[int]:
        """Ids to append after a completion so the next assistant turn can start.

        That is: whatever closes the assistant turn that the engine did not sample (Qwen stops at
        ``<|im_end|>`` but the template continues with ``\\n``; a turn cut by the length limit
        gets its whole closing), then the observation messages, then the generation prompt.
        """
        return self.encode_text(self.observation_text(observation, completion_ids), observation)

    def observation_text(
        self, observation: Sequence[Message], completion_ids: Sequence[int]
    ) -> str:
        """The text :meth:`observation_ids` encodes."""
        if not observation:
            raise TemplateError("observation_ids needs at least one observation message")
        text = self._assistant_close + self._suffix(observation)
        if completion_ids and completion_ids[-1] in self._stop_texts:
            # The sampled stop token stands for the template's next stop text: the closing
            # (ChatML's <|im_end|>; harmony's <|call|> for <|return|>) or the next role's token
            # (GLM's <|observation|>), which must not be appended a second time.
            for stop_text in self._stop_texts.values():
                if text.startswith(stop_text):
                    return text[len(stop_text) :]
        return text

    def parser_for(self, requested: str) -> str:
        """The tool-call parser for this template: ``requested``, or with ``"auto"`` the one
        its format implies (an unrecognised template with tools is a ``ToolError``)."""
        from agentloop.tools import resolve_parser

        return resolve_parser(requested, self.chat_template, has_tools=bool(self.tools))

    def image_grids(self, messages: Sequence[Message]) -> list[tuple[int, int, int]]:
        """Patch grids of the images in ``messages``, in token order (needs ``vision``)."""
        images = [im for m in messages for im in m.images]
        if images and self.vision is None:
            raise TemplateError(_NO_VISION.format(len(images)))
        return [self.vision.grid(im) for im in images] if self.vision else []

    def check_text(self, token_ids: Sequence[int], messages: Sequence[Message]) -> None:
        """Check that ``token_ids`` decode to the template's rendering of ``messages``.

        Used in tests and with ``RolloutConfig.check_template``: it proves the accumulated ids are
        what the template would show the model for this conversation, turn boundaries included.
        """
        ends_with_sample = messages[-1].role == "assistant"
        expected = self.render(messages, add_generation_prompt=not ends_with_sample)
        ids = self.vision.collapse(token_ids) if self.vision else list(token_ids)
        got = str(self.tokenizer.decode(ids, skip_special_tokens=False))
        # An episode that ended right after a sample lacks only (part of) the turn's closing;
        # its last stop token may be the next role's (GLM's <|user|>), which no turn renders.
        ends = [got] + [got[: -len(s)] for s in self._stop_texts.values() if got.endswith(s)]
        if ends_with_sample and any(
            expected.startswith(e) and self._assistant_close.endswith(expected[len(e) :])
            for e in ends
        ):
            return
        if got != expected:
            at = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), 0)
            raise TemplateError(
                f"token ids do not render the conversation: first difference at char {at}: "
                f"ids give {got[at : at + 60]!r}, template gives {expected[at : at + 60]!r}"
            )

    # -- internals ---------------------------------------------------------------------------

    def _expand(self, ids: list[int], messages: Sequence[Message]) -> list[int]:
        images = [im for m in messages for im in m.images]
        if self.vision is None:
            if images:
                raise TemplateError(_NO_VISION.format(len(images)))
            return ids
        return self.vision.expand(ids, images)

    def _suffix(self, observation: Sequence[Message]) -> str:
        """The text the template adds for ``observation`` after a finished assistant turn."""
        return self._filled("suffix", observation, self._render_suffix)

    def _render_prompt(self, messages: Sequence[Message]) -> str:
        return self.render(messages, add_generation_prompt=True)

    def _filled(
        self, kind: str, messages: Sequence[Message], render: Callable[[Sequence[Message]], str]
    ) -> str:
        """``render(messages)``, mostly without rendering.

        Per message *shape* (roles, names, call ids, image counts, empty contents) the template's
        text around each content is learned once and then filled in, so a prompt or a turn costs
        no template render. A shape is learned only if filling reproduces real renders (including
        content with edge whitespace, which ``trim`` filters would change); otherwise every call
        renders.
        """
        key = (
            kind,
            *[(m.role, m.name, m.tool_call_id, len(m.images), not m.content) for m in messages],
        )
        fragments = self._fragments.get(key, _UNLEARNED)
        if fragments is _UNLEARNED:
            fragments = self._learn_fragments(messages, render)
            if len(self._fragments) < _MAX_SHAPES:
                self._fragments[key] = fragments
        if fragments is None:
            return render(messages)
        return _fill(fragments, [m.content for m in messages])

    def _learn_fragments(
        self, observation: Sequence[Message], render: Callable[[Sequence[Message]], str]
    ) -> tuple[str, ...] | None:
        slots = [_SLOT.format(i) for i in range(len(observation))]
        text = render(_with_contents(observation, slots))
        fragments = []
        for slot in slots:
            before, found, text = text.partition(slot)
            if not found:
                return None
            fragments.append(before)
        fragments.append(text)
        edgy = [f" \n{i} x\t\n " for i in range(len(observation))]
        for contents in ([m.content for m in observation], edgy):
            if _fill(fragments, contents) != render(_with_contents(observation, contents)):
                return None
        return tuple(fragments)

    def _render_suffix(self, observation: Sequence[Message]) -> str:
        # A fixed short history stands in for the real one: for a prefix-stable template the
        # suffix depends only on the new messages, and the short render is much cheaper.
        before = self._probe_text
        after = self.render(
            [*_PROBE_MESSAGES, *observation], add_generation_prompt=True, with_tools=False
        )
        if not after.startswith(before):
            raise TemplateError(
                "chat template is not prefix-stable: adding "
                f"{[m.role for m in observation]} messages changes the text of earlier turns. "
                "agentloop needs a template whose earlier turns render the same when messages are "
                "appended (pass chat_template=... with such a template)"
            )
        return after[len(before) :]

    def _probe_template(self) -> tuple[str, str | None]:
        """Check the template once; return the text that closes an assistant turn and how the
        template rewrites history (``"thinking"``, ``"history"``), or None if it does not."""
        probe = _PROBE_MESSAGES
        head = self.render(probe[:2], add_generation_prompt=False)
        with_prompt = self.render(probe[:2], add_generation_prompt=True)
        full = self.render(probe, add_generation_prompt=False)
        if not with_prompt.startswith(head):
            raise TemplateError("chat template: the generation prompt rewrites earlier turns")
        at = full.find(_PROBE)
        if at < 0 or full[:at] != with_prompt:
            raise TemplateError(
                "chat template does not render an assistant turn as <generation prompt> + content: "
                f"expected the text before the content to be {with_prompt[len(head) :]!r}. "
                "Sampled tokens would not line up with the template's rendering"
            )
        close = full[at + len(_PROBE) :]
        # A template is prefix-stable only if appending a user turn does not rewrite the
        # assistant turn, with or without a reasoning block in it.
        follow = Message("user", "probe follow-up")
        try:
            self._suffix([follow])
        except TemplateError:
            return close, "history"
        think = [*probe[:2], _THINK_PROBE]
        full = self.render(think, add_generation_prompt=False)
        after = self.render([*think, follow], add_generation_prompt=True)
        if full.startswith(with_prompt + _THINK_PROBE.content) and after.startswith(full):
            return close, None
        return close, "thinking"


def _with_contents(messages: Sequence[Message], contents: Sequence[str]) -> list[Message]:
    return [replace(m, content=c) for m, c in zip(messages, contents, strict=True)]


def _fill(fragments: Sequence[str], contents: Sequence[str]) -> str:
    parts = [fragments[0]]
    for content, fragment in zip(contents, fragments[1:], strict=True):
        parts += [content, fragment]
    return "".join(parts)


def _stop_token_ids(tokenizer: Any) -> tuple[int, ...]:
    """EOS ids of the tokenizer and of the model's generation config, if it sits next to it."""
    ids: list[int] = []
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        ids.append(eos)
    path = getattr(tokenizer, "name_or_path", "")
    if path:
        try:
            from transformers import GenerationConfig

            gen_eos = GenerationConfig.from_pretrained(path).eos_token_id
        except (OSError, ValueError):
            gen_eos = None
        for i in [gen_eos] if isinstance(gen_eos, int) else gen_eos or []:
            if i not in ids:
                ids.append(int(i))
    if not ids:
        raise TemplateError(
            "the tokenizer has no eos_token_id; set tokenizer.eos_token (e.g. '<|im_end|>')"
        )
    return tuple(ids)
