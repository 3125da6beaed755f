package websocket

import (
	"context"
	"net/http"

	ws "github.com/coder/websocket"
	"github.com/ssebus/eventbus/sseclient"
)

// DefaultReadLimit is a Dialer's bound of one message when ReadLimit is 0:
// sseclient's DefaultMaxEventBytes (one event of the server's largest,
// with room) plus the 256 KiB a batch takes besides.
const DefaultReadLimit = sseclient.DefaultMaxEventBytes + 256<<10

// Dialer opens the WebSocket of a Go client: set it as
// sseclient.Client.WebSocket (with WebSocketURL), and the client reads the
// multiplexed stream over this module's transport first and over SSE as
// the fallback, with one cursor (docs/SPEC.md 6.10). It offers the
// subprotocol eventbus.v1. A Dialer is safe for concurrent use; its zero
// value uses http.DefaultClient and DefaultReadLimit.
type Dialer struct {
	// HTTPClient makes the handshake; nil means http.DefaultClient. Its
	// Transport must allow the connection to be taken over (HTTP/1.1), as
	// every http.Transport does.
	HTTPClient *http.Client
	// ReadLimit bounds one message, in bytes; 0 means DefaultReadLimit. A
	// larger message ends the connection (the client reconnects, and meets
	// it again: raise it with the server's event size).
	ReadLimit int64
}

// DialWebSocket is sseclient.WebSocketDialer's: it opens url with header
// on the handshake. A handshake the server answered with another status
// than 101 returns that answer, whose body holds up to 1 KiB of it (the
// server's JSON error).
func (d *Dialer) DialWebSocket(ctx context.Context, url string, header http.Header) (sseclient.WebSocketConn, *http.Response, error) {
	c, resp, err := ws.Dial(ctx, url, &ws.DialOptions{
		HTTPClient:   d.HTTPClient,
		HTTPHeader:   header,
		Subprotocols: []string{Subprotocol},
	})
	if err != nil {
		return nil, resp, err
	}
	limit := d.ReadLimit
	if limit <= 0 {
		limit = DefaultReadLimit
	}
	c.SetReadLimit(limit)
	return dialed{c}, resp, nil
}

// dialed is a client's open WebSocket, as sseclient uses it.
type dialed struct{ c *ws.Conn }

func (d dialed) ReadMessage(ctx context.Context) ([]byte, error) {
	typ, p, err := d.c.Read(ctx)
	if err == nil && typ != ws.MessageText {
		return nil, sseclient.ErrWebSocketBinary
	}
	return p, err
}

func (d dialed) WriteMessage(ctx context.Context, p []byte) error {
	return d.c.Write(ctx, ws.MessageText, p)
}

func (d dialed) Ping(ctx context.Context) error { return d.c.Ping(ctx) }

// Close closes at once, without the close handshake, whose wait for the
// server's answer would hold the client's Run for up to 5 s: the server
// takes a connection that ends for the client leaving.
func (d dialed) Close() error { return d.c.CloseNow() }
