"""The OpenAI Responses streaming events of a finished `Response`.

Generation is complete before the first event (as for chat streams, `chat.py`), so the
stream replays the recorded response in the order the OpenAI API sends it: `response.created`,
`response.in_progress`, then per output item `output_item.added`, its content (`content_part` +
one `output_text.delta`, or one `function_call_arguments.delta`), its `done` events, and finally
`response.completed` with the response itself. SDK stream helpers and agent frameworks (the
OpenAI Agents SDK's streamed runs) rebuild the response from these.
"""

from __future__ import annotations

from typing import Any


# Long on purpose: the events are the API's fixed sequence, kept in one place to read in order.
def response_stream_events(response: Any) -> list[Any]:
    """The `ResponseStreamEvent`s (pydantic objects) that replay `response`."""
    from openai.types.responses import (
        ResponseCompletedEvent,
        ResponseContentPartAddedEvent,
        ResponseContentPartDoneEvent,
        ResponseCreatedEvent,
        ResponseFunctionCallArgumentsDeltaEvent,
        ResponseFunctionCallArgumentsDoneEvent,
        ResponseInProgressEvent,
        ResponseOutputItemAddedEvent,
        ResponseOutputItemDoneEvent,
        ResponseTextDeltaEvent,
        ResponseTextDoneEvent,
    )

    events: list[Any] = []

    def emit(kind: type, **fields: Any) -> None:
        events.append(kind(sequence_number=len(events), **fields))

    pending = response.model_copy(update={"status": "in_progress", "output": [], "usage": None})
    emit(ResponseCreatedEvent, type="response.created", response=pending)
    emit(ResponseInProgressEvent, type="response.in_progress", response=pending)
    for index, item in enumerate(response.output):
        if item.type == "message":
            emit(
                ResponseOutputItemAddedEvent,
                type="response.output_item.added",
                output_index=index,
                item=item.model_copy(update={"status": "in_progress", "content": []}),
            )
            for j, part in enumerate(item.content):
                where = {"item_id": item.id, "output_index": index, "content_index": j}
                emit(
                    ResponseContentPartAddedEvent,
                    type="response.content_part.added",
                    **where,
                    part=part.model_copy(update={"text": ""}),
                )
                emit(
                    ResponseTextDeltaEvent,
                    type="response.output_text.delta",
                    **where,
                    delta=part.text,
                    logprobs=[],
                )
                emit(
                    ResponseTextDoneEvent,
                    type="response.output_text.done",
                    **where,
                    text=part.text,
                    logprobs=[],
                )
                emit(ResponseContentPartDoneEvent, type="response.content_part.done", **where, part=part)
        else:  # function_call
            emit(
                ResponseOutputItemAddedEvent,
                type="response.output_item.added",
                output_index=index,
                item=item.model_copy(update={"status": "in_progress", "arguments": ""}),
            )
            where = {"item_id": item.id, "output_index": index}
            emit(
                ResponseFunctionCallArgumentsDeltaEvent,
                type="response.function_call_arguments.delta",
                **where,
                delta=item.arguments,
            )
            emit(
                ResponseFunctionCallArgumentsDoneEvent,
                type="response.function_call_arguments.done",
                **where,
                arguments=item.arguments,
                name=item.name,
            )
        emit(ResponseOutputItemDoneEvent, type="response.output_item.done", output_index=index, item=item)
    emit(ResponseCompletedEvent, type="response.completed", response=response)
    return events


def format_response_sse(events: list[Any]) -> str:
    """Server-sent-event text (`event: TYPE` / `data: JSON`) of Responses stream events."""
    return "".join(f"event: {e.type}\ndata: {e.model_dump_json(exclude_none=True)}\n\n" for e in events)
