"""One reader per row format of a prompt file, each normalising a row to the sample shape the pipeline reads.

| row key         | format                                                        | sample            |
|-----------------|---------------------------------------------------------------|-------------------|
| `messages`      | OpenAI chat: `[{"role", "content"}]`, content a string or text parts | `{"messages"}` |
| `conversations` | ShareGPT: `[{"from": human|gpt|system, "value"}]`             | `{"messages"}`    |
| `prompt`        | one plain prompt string (no chat template)                    | `{"prompt"}`      |
| `text`          | plain text (teacher-forced, or a raw prompt)                  | `{"text"}`        |

Every turn of a conversation is kept, assistant turns included: synthesis regenerates
them, ``synthesize: false`` trains on them. A bad row raises :class:`RowError` (the
problem and its fix); the caller names the file and line.
"""

from __future__ import annotations

from typing import Any, Callable

FORMATS = ("messages", "conversations", "prompt", "text")

# ShareGPT speakers -> chat roles. "gpt" and "human" are the original dump's; the others
# appear in its many re-exports (chatgpt, bard, bing) and in Gemma-style dumps (model).
SHAREGPT_ROLES = {
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant", "bard": "assistant", "bing": "assistant",
    "model": "assistant",
    "system": "system",
}


# Roles a chat template can be given: OpenAI's (developer, tool, function among them) and Llama 3's
# ipython. Anything else ("wizard") is a typo or another schema, refused rather than passed on to a
# template that would drop or mangle the turn.
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool", "function", "ipython")


class RowError(ValueError):
    """Why a row is not a sample, and the fix (the caller adds the file and line)."""

    def __init__(self, problem: str, fix: str):
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


def json_type(value: Any) -> str:
    """The JSON name of a parsed value's type (what the user wrote, not Python's name)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def read_row(item: Any) -> dict[str, Any]:
    """A sample from one parsed row: the reader of the one format key it holds (``id`` kept)."""
    if not isinstance(item, dict):
        raise RowError(f"is a JSON {json_type(item)}, not an object", fix='one JSON object per line, e.g. {"prompt": "..."}')
    keys = [k for k in FORMATS if k in item]
    if not keys:
        raise RowError("has no 'messages', 'conversations', 'prompt' or 'text' field",
                       fix='e.g. {"messages": [{"role": "user", "content": "..."}]} or {"prompt": "..."}')
    if len(keys) > 1:
        raise RowError(f"has both '{keys[0]}' and '{keys[1]}'", fix="keep one format per line")
    sample = READERS[keys[0]](item[keys[0]])
    if "id" in item:
        sample["id"] = item["id"]
    if "category" in item:  # bench reports acceptance per category
        if not isinstance(item["category"], str) or not item["category"].strip():
            raise RowError(f"has a 'category' that is a JSON {json_type(item['category'])}, not a non-empty string",
                           fix='e.g. "category": "code"')
        sample["category"] = item["category"].strip()
    return sample


def read_messages(value: Any) -> dict[str, Any]:
    """OpenAI ``messages``: roles kept as written, content parts joined into one string."""
    fix = 'write a list of {"role": ..., "content": "..."} objects, or use "prompt" for plain text'
    if not isinstance(value, list):
        raise RowError(f"'messages' is a JSON {json_type(value)}, not a list of messages", fix=fix)
    out = []
    for n, message in enumerate(value):
        where = f"messages[{n}]"
        if not isinstance(message, dict):
            raise RowError(f"{where} is a JSON {json_type(message)}, not an object with role and content", fix=fix)
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise RowError(f"{where} needs a string 'role'", fix=fix)
        if role not in CHAT_ROLES:
            raise RowError(f"{where} has role {role!r}, not {', '.join(CHAT_ROLES[:-1])} or {CHAT_ROLES[-1]}",
                           fix="use one of these roles, or remove the line")
        out.append({"role": role, "content": _content(message.get("content"), where, fix)})
    return {"messages": _checked_turns(out, "messages", fix)}


def read_conversations(value: Any) -> dict[str, Any]:
    """ShareGPT ``conversations`` as chat messages.

    A leading assistant turn (the ShareGPT dump has conversations that open with one)
    is dropped, as FastChat-derived trainers do ("Skip the first one if it is not from
    human"): there is no user turn for it to answer.
    """
    fix = 'write a list of {"from": "human" | "gpt" | "system", "value": "..."} objects'
    if not isinstance(value, list):
        raise RowError(f"'conversations' is a JSON {json_type(value)}, not a list of turns", fix=fix)
    out = []
    for n, turn in enumerate(value):
        where = f"conversations[{n}]"
        if not isinstance(turn, dict):
            raise RowError(f"{where} is a JSON {json_type(turn)}, not an object with from and value", fix=fix)
        if "from" not in turn and "role" in turn:  # re-exports that kept ShareGPT's key but OpenAI's fields
            speaker, content = turn.get("role"), turn.get("content")
        else:
            speaker, content = turn.get("from"), turn.get("value")
        role = SHAREGPT_ROLES.get(speaker.lower()) if isinstance(speaker, str) else None
        if role is None:
            raise RowError(f"{where} has from {speaker!r}, not human, gpt or system", fix=fix)
        out.append({"role": role, "content": _content(content, where, fix)})
    while out and out[0]["role"] == "assistant":
        out.pop(0)
    return {"messages": _checked_turns(out, "conversations", fix)}


def read_prompt(value: Any) -> dict[str, Any]:
    return {"prompt": _plain(value, "prompt")}


def read_text(value: Any) -> dict[str, Any]:
    return {"text": _plain(value, "text")}


READERS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "messages": read_messages,
    "conversations": read_conversations,
    "prompt": read_prompt,
    "text": read_text,
}


def _plain(value: Any, key: str) -> str:
    if not isinstance(value, str):
        raise RowError(f"'{key}' is a JSON {json_type(value)}, not a string", fix=f'write "{key}": "..."')
    if not value.strip():
        raise RowError(f"'{key}' is empty", fix="remove the line or give it text")
    return value


def _content(content: Any, where: str, fix: str) -> str:
    """A turn's text: a string, or OpenAI content parts of type text (joined by newlines)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for k, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text" or not isinstance(part.get("text"), str):
                raise RowError(f"{where}.content[{k}] is not a text part (type {kind!r})",
                               fix="keep only {\"type\": \"text\", \"text\": \"...\"} parts, or remove the line")
            texts.append(part["text"])
        return "\n".join(texts)
    raise RowError(f"{where} content is a JSON {json_type(content)}, not a string", fix=fix)


def _checked_turns(messages: list[dict[str, str]], key: str, fix: str) -> list[dict[str, str]]:
    """A conversation needs a non-empty user turn to answer."""
    users = [m for m in messages if m["role"] == "user"]
    if not users:
        raise RowError(f"'{key}' has no user turn", fix=f"{fix}, with at least one user turn, or remove the line")
    if any(not m["content"].strip() for m in users):
        raise RowError(f"'{key}' has an empty user turn", fix="give it text or remove the line")
    return messages
