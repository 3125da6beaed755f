package eventbus

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// refParseLastEventID is the reference: one or more ASCII digits whose
// value, by strconv.ParseUint, is at most 2^53-1.
func refParseLastEventID(s string) (uint64, bool) {
	if s == "" {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil || v > 1<<53-1 {
		return 0, false
	}
	return v, true
}

func FuzzParseLastEventID(f *testing.F) {
	for _, s := range []string{
		"", "0", "1", "007", "42",
		"9007199254740991", "09007199254740991", "9007199254740992",
		"18446744073709551615", "18446744073709551616", "99999999999999999999999",
		strings.Repeat("0", 100) + "1", strings.Repeat("9", 1000),
		"-1", "+1", " 1", "1 ", "1.0", "abc", "0x10", "1e3", "1_000",
		"\u0661", "1\x00", "\xff", "\t1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := ParseLastEventID(s)
		want, wantOK := refParseLastEventID(s)
		require.Equal(t, wantOK, ok, "%q", s)
		require.Equal(t, want, got, "%q", s)
	})
}

// refParseMaxQueued is the reference for one maxQueued value.
func refParseMaxQueued(s string) (int, bool) {
	if s == "" {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil || v < MinClientMaxQueued || v > MaxClientMaxQueued {
		return 0, false
	}
	return int(v), true
}

func FuzzParseMaxQueued(f *testing.F) {
	for _, s := range []string{
		"", "0", "15", "16", "0016", "2048", "2049", "99999999999999999999",
		strings.Repeat("0", 50) + "16", "+16", " 16", "-1", "abc", "16.0", "\uff11\uff16",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := parseMaxQueued([]string{s})
		want, ok := refParseMaxQueued(s)
		require.Equal(t, ok, err == nil, "%q: %v", s, err)
		if ok {
			require.Equal(t, want, got)
		}
		_, err = parseMaxQueued([]string{s, s})
		require.Error(t, err, "a repeated value is always rejected")
	})
}

// jsonRoundTrip is what a JSON client reads back for s: encoding/json
// coerces invalid UTF-8 to U+FFFD.
func jsonRoundTrip(t *testing.T, s string) string {
	b, err := json.Marshal(s)
	require.NoError(t, err)
	var out string
	require.NoError(t, json.Unmarshal(b, &out))
	return out
}

func FuzzFrameRoundTrip(f *testing.F) {
	for _, seed := range [][3]string{
		{"session_update", `{"a":1}`, "c1"},
		{"e", "", ""},
		{" leading space", "line1\nline2\r\nline3\rend", "client\nwith newline"},
		{"a: b", "data: injected\n\nid: 99\n\n", "\r\n"},
		{":colon", "\x00\x01\x1f\"\\", "\u2028\u2029"},
		{"id: 7", "\xff\xfe invalid utf-8", "\xc3"},
		{"tab\there", "<html>&amp;</html>", "é"},
		{"nul\x00type", strings.Repeat("z", 4096), ""},
		{"\u2028", "\u2028\u2029", "x"},
		{"\xff", "", ""},
		{"", "rejected: empty", ""},
		{"a\nb", "rejected: LF", ""},
		{"a\rb", "rejected: CR", ""},
		{"a\r\nevent: evil", "rejected: CRLF", ""},
	} {
		f.Add(seed[0], seed[1], seed[2])
	}
	f.Fuzz(func(t *testing.T, typ, data, orig string) {
		logs := &logCapture{}
		b, err := New(Options{Now: testNow, Logger: logs.logger(), OnDiagnostic: logs.diag})
		require.NoError(t, err)
		defer b.Close()

		injectable := typ == "" || strings.ContainsAny(typ, "\r\n")
		fr, err := b.Publish(Event{Type: typ, Data: data, OriginatorClientID: orig})
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidEvent)
			require.True(t, injectable, "only an empty type or one with CR or LF is rejected: %q: %v", typ, err)
			require.Zero(t, b.LastEventID())
			return
		}
		require.False(t, injectable, "a type that could inject SSE lines was accepted: %q", typ)

		wire := fr.AppendSSE(nil)
		require.Equal(t, fr.String(), string(wire))
		js := fr.JSON()
		require.NotContains(t, string(js), "\n")
		require.NotContains(t, string(js), "\r")
		require.True(t, json.Valid(js), "%q", js)
		require.Equal(t, len(js), fr.Size())

		recs, err := parseSSE(wire)
		require.NoError(t, err, "a frame ends on an event boundary: %q", wire)
		require.Len(t, recs, 1, "exactly one record: %q", wire)
		require.Equal(t, sseEventRecord, recs[0].Kind)
		ev := recs[0].Event
		require.Equal(t, typ, ev.Type)
		require.Equal(t, string(js), ev.Data)
		require.Equal(t, strconv.FormatUint(fr.ID(), 10), ev.ID)
		require.Equal(t, uint64(1), fr.ID())

		var env struct {
			ID   uint64  `json:"id"`
			V    int     `json:"v"`
			Type string  `json:"type"`
			Data *string `json:"data"`
			Meta struct {
				ServerTimestamp int64 `json:"serverTimestamp"`
			} `json:"_meta"`
			Orig *string `json:"originatorClientId"`
		}
		dec := json.NewDecoder(strings.NewReader(ev.Data))
		dec.DisallowUnknownFields()
		require.NoError(t, dec.Decode(&env))
		require.Equal(t, fr.ID(), env.ID)
		require.Equal(t, SchemaVersion, env.V)
		require.Equal(t, jsonRoundTrip(t, typ), env.Type)
		require.NotNil(t, env.Data)
		require.Equal(t, jsonRoundTrip(t, data), *env.Data)
		require.Equal(t, int64(testStamp), env.Meta.ServerTimestamp)
		if orig == "" {
			require.Nil(t, env.Orig)
		} else {
			require.NotNil(t, env.Orig)
			require.Equal(t, jsonRoundTrip(t, orig), *env.Orig)
		}
	})
}

func FuzzStreamErrorFrame(f *testing.F) {
	f.Add("internal error", "internal")
	f.Add("line\nbreak\r\n", "kind\r")
	f.Add("\xff\x00\"", "")
	f.Fuzz(func(t *testing.T, msg, kind string) {
		fr := StreamErrorFrame(msg, kind)
		require.True(t, fr.Terminal())
		require.True(t, fr.Synthetic())
		require.Zero(t, fr.ID())
		recs, err := parseSSE(fr.AppendSSE(nil))
		require.NoError(t, err)
		require.Len(t, recs, 1)
		ev := recs[0].Event
		require.Equal(t, TypeStreamError, ev.Type)
		require.Empty(t, ev.ID, "no id line")
		var env struct {
			V    int    `json:"v"`
			Type string `json:"type"`
			Data struct {
				Error     *string `json:"error"`
				ErrorKind *string `json:"errorKind"`
			} `json:"data"`
		}
		require.NoError(t, json.Unmarshal([]byte(ev.Data), &env))
		require.Equal(t, TypeStreamError, env.Type)
		require.NotNil(t, env.Data.Error)
		require.NotNil(t, env.Data.ErrorKind)
		require.Equal(t, jsonRoundTrip(t, msg), *env.Data.Error)
		require.Equal(t, jsonRoundTrip(t, kind), *env.Data.ErrorKind)
	})
}

// FuzzSSEParserSplit checks the harness's SSE reader: how the stream is cut
// into reads never changes what it reports, nor whether it ended on an
// event boundary.
func FuzzSSEParserSplit(f *testing.F) {
	f.Add("event: a\r\ndata: x\r\n\r\n", uint(9))
	f.Add("data: 1\rdata: 2\r\r: c\n", uint(8))
	f.Add("\uFEFFid: 1\x00\ndata\n\n", uint(1))
	f.Add("retry: 12\nretry: x\n\n", uint(3))
	f.Fuzz(func(t *testing.T, in string, cut uint) {
		whole, errWhole := parseSSE([]byte(in))
		i := int(cut % uint(len(in)+1))
		parts, errParts := readSplit(in, i)
		require.Equal(t, whole, parts)
		require.Equal(t, errWhole, errParts)
		for _, r := range whole {
			if r.Kind == sseEventRecord {
				require.NotEmpty(t, r.Event.Type)
				require.NotContains(t, r.Event.ID, "\x00")
			}
		}
	})
}

// FuzzHandlerRequest drives the request rules with fuzzed Last-Event-ID,
// lastEventId, epoch and maxQueued values: never a panic, never a 5xx, 400
// exactly when maxQueued is invalid, a malformed cursor (either id form,
// ParseEventID) is logged with at most 64 bytes of it, and an epoch that
// disagrees with the id's is logged once.
func FuzzHandlerRequest(f *testing.F) {
	f.Add("3", "", "", "16")
	f.Add("", "abc", "x", "")
	f.Add("9007199254740992", "1", strings.Repeat("e", 65), "2049")
	f.Add(strings.Repeat("7", 200), "", "", "0016")
	f.Add("\xff", "\x00", "\n", "+16")
	f.Add("0123456789abcdef0123456789abcdef:1", "", "0123456789abcdef0123456789abcdef", "")
	f.Add("", "0123456789abcdef0123456789abcdef:1", "fedcba9876543210fedcba9876543210", "")
	f.Add("0123456789abcdef0123456789ABCDEF:1", "", "", "")
	f.Fuzz(func(t *testing.T, header, query, epoch, maxQueued string) {
		logs := &logCapture{}
		b, err := New(Options{Now: testNow, Logger: logs.logger(), OnDiagnostic: logs.diag})
		require.NoError(t, err)
		defer b.Close()
		_, err = b.Publish(Event{Type: "e"})
		require.NoError(t, err)

		q := url.Values{}
		if query != "" {
			q.Set("lastEventId", query)
		}
		if epoch != "" {
			q.Set("epoch", epoch)
		}
		if maxQueued != "" {
			q.Set("maxQueued", maxQueued)
		}
		target := "/session/s/events"
		if len(q) > 0 {
			target += "?" + q.Encode()
		}
		// A request whose client is already gone: the handler answers and
		// returns at once without streaming.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		req := httptest.NewRequest(http.MethodGet, target, nil).WithContext(ctx)
		if header != "" {
			req.Header["Last-Event-Id"] = []string{header}
		}
		w := newMemWriter()
		busHandler(b, logs).ServeHTTP(w, req)
		st := w.state()

		_, mqOK := refParseMaxQueued(maxQueued)
		if maxQueued != "" && !mqOK {
			requireJSONError(t, st.status, st.header, []byte(st.body), http.StatusBadRequest, "invalid_max_queued")
			return
		}
		require.Equal(t, http.StatusOK, st.status, "body %q", st.body)
		require.Empty(t, st.body, "nothing is written once the client is gone (no write deadline is armed then)")
		require.Zero(t, b.SubscriberCount())

		raw := header
		if raw == "" {
			raw = query
		}
		malformed := logs.find("malformed Last-Event-ID")
		disagree := logs.find("disagree")
		idEpoch, _, ok := refParseEventID(raw)
		if ok || raw == "" {
			require.Empty(t, malformed)
			// An epoch given beside one in the id must be the same.
			given := epoch
			if len(given) > 64 {
				given = ""
			}
			require.Equal(t, idEpoch != "" && given != "" && given != idEpoch, len(disagree) == 1, "epoch %q, id %q: %v", epoch, raw, disagree)
			return
		}
		require.Len(t, malformed, 1)
		v, err := strconv.Unquote(malformed[0].Attrs["value"])
		require.NoError(t, err)
		require.Equal(t, raw[:min(len(raw), 64)], v)
	})
}
