// @ssebus/eventbus-client: a resumable browser and Node client of an
// eventbus Server-Sent Events stream, and the strict SSE parser it uses.
export { EventBusClient, EventBusError, SYNTHETIC_TYPES, connect, parseEventId, parseRetryAfter } from "./client.js";
export { epochTag, formatCursor, parseCursor, sessionTag } from "./cursor.js";
export { DEFAULT_MAX_EVENT_BYTES, SSEParseError, SSEParser } from "./parser.js";
