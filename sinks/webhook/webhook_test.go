package webhook

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
)

const (
	testSecret  = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	testSecret2 = "a raw secret, not base64"
)

var t0 = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

func testEvent(tb testing.TB, i int) *event.Event {
	tb.Helper()
	raw, err := bson.Marshal(bson.D{
		{Key: "_id", Value: bson.D{{Key: "_data", Value: fmt.Sprintf("8266%016X", i)}}},
		{Key: "operationType", Value: "insert"},
		{Key: "clusterTime", Value: bson.Timestamp{T: 1_700_000_000, I: uint32(i)}},
		{Key: "ns", Value: bson.D{{Key: "db", Value: "shop"}, {Key: "coll", Value: "orders"}}},
		{Key: "documentKey", Value: bson.D{{Key: "_id", Value: int32(i)}}},
		{Key: "fullDocument", Value: bson.D{
			{Key: "_id", Value: int32(i)}, {Key: "status", Value: "paid"},
			{Key: "total", Value: 123.5}, {Key: "note", Value: strings.Repeat("x", 200)},
		}},
	})
	if err != nil {
		tb.Fatal(err)
	}
	e, err := event.FromChange("orders", uint64(i), raw)
	if err != nil {
		tb.Fatal(err)
	}
	e.Rules = []string{"paid"}
	return e
}

func envelope(tb testing.TB, e *event.Event, canonical bool) []byte {
	tb.Helper()
	b, err := e.Envelope(canonical)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// recorded is one request seen by a recorder.
type recorded struct {
	path   string
	query  string // the raw query, as on the wire
	header http.Header
	body   []byte
}

// recorder is an HTTP handler that records requests and answers with
// respond (204 when nil).
type recorder struct {
	mu      sync.Mutex
	reqs    []recorded
	respond func(w http.ResponseWriter, r *http.Request)
}

func (rc *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	rc.reqs = append(rc.reqs, recorded{path: r.URL.Path, header: r.Header.Clone(), body: body})
	respond := rc.respond
	rc.mu.Unlock()
	if respond == nil {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	respond(w, r)
}

func (rc *recorder) requests() []recorded {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]recorded(nil), rc.reqs...)
}

func newServer(t testing.TB, respond func(w http.ResponseWriter, r *http.Request)) (*httptest.Server, *recorder) {
	t.Helper()
	rc := &recorder{respond: respond}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	return srv, rc
}

func newSink(t testing.TB, cfg Config) *Webhook {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = "test"
	}
	w, err := New(cfg, nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

// clock returns a now function yielding start, start+step, start+2*step...
func clock(start time.Time, step time.Duration) func() time.Time {
	var n atomic.Int64
	return func() time.Time { return start.Add(time.Duration(n.Add(1)-1) * step) }
}

// independentSig computes a v1 signature without the package's code.
func independentSig(t *testing.T, secret, id, ts string, body []byte) string {
	t.Helper()
	var key []byte
	if b64, ok := strings.CutPrefix(secret, "whsec_"); ok {
		var err error
		if key, err = base64.StdEncoding.DecodeString(b64); err != nil {
			t.Fatal(err)
		}
	} else {
		key = []byte(secret)
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id + "." + ts + "."))
	m.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
}

func asSinkError(t *testing.T, err error) *sinks.Error {
	t.Helper()
	var de *sinks.Error
	if !errors.As(err, &de) {
		t.Fatalf("error %v (%T) is not a *sinks.Error", err, err)
	}
	return de
}

// TestSpecExampleVector checks Sign and Verify against the example of the
// Standard Webhooks reference libraries.
func TestSpecExampleVector(t *testing.T) {
	const (
		id   = "msg_p5jXN8AQM9LWM0D4loKWxJek"
		want = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	)
	ts := time.Unix(1614265330, 0)
	body := []byte(`{"test": 2432232314}`)
	got, err := Sign([]string{testSecret}, id, ts, body)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("Sign = %q, want %q", got, want)
	}
	h := http.Header{}
	h.Set("webhook-id", id)
	h.Set("webhook-timestamp", "1614265330")
	h.Set("webhook-signature", want)
	if err := Verify([]string{testSecret}, h, body, 5*time.Minute, ts.Add(10*time.Second)); err != nil {
		t.Fatalf("Verify: %v", err)
	}
}

func TestVerify(t *testing.T) {
	const id = "orders:8266"
	body := []byte(`{"a":1}`)
	now := time.Unix(1_800_000_000, 0)
	ts := strconv.FormatInt(now.Unix(), 10)
	sig1 := independentSig(t, testSecret, id, ts, body)
	sig2 := independentSig(t, testSecret2, id, ts, body)
	hdr := func(id, ts, sig string) http.Header {
		h := http.Header{}
		if id != "" {
			h.Set("webhook-id", id)
		}
		if ts != "" {
			h.Set("webhook-timestamp", ts)
		}
		if sig != "" {
			h.Set("webhook-signature", sig)
		}
		return h
	}
	tests := []struct {
		name    string
		secrets []string
		h       http.Header
		body    []byte
		tol     time.Duration
		now     time.Time
		want    error // nil: valid; otherwise errors.Is target
		wantMsg string
	}{
		{"valid", []string{testSecret}, hdr(id, ts, sig1), body, time.Minute, now, nil, ""},
		{"valid raw secret", []string{testSecret2}, hdr(id, ts, sig2), body, time.Minute, now, nil, ""},
		{"rotation: second secret matches", []string{testSecret, testSecret2}, hdr(id, ts, sig2), body, time.Minute, now, nil, ""},
		{"several signatures, one valid", []string{testSecret2}, hdr(id, ts, sig1+" "+sig2), body, time.Minute, now, nil, ""},
		{"unknown versions ignored", []string{testSecret}, hdr(id, ts, "v1a,abcd "+sig1), body, time.Minute, now, nil, ""},
		{"tolerance disabled", []string{testSecret}, hdr(id, ts, sig1), body, 0, now.Add(time.Hour), nil, ""},
		{"tampered body", []string{testSecret}, hdr(id, ts, sig1), []byte(`{"a":2}`), time.Minute, now, ErrNoMatchingSignature, ""},
		{"wrong id", []string{testSecret}, hdr("other", ts, sig1), body, time.Minute, now, ErrNoMatchingSignature, ""},
		{"wrong secret", []string{"whsec_" + base64.StdEncoding.EncodeToString([]byte("nope"))}, hdr(id, ts, sig1), body, time.Minute, now, ErrNoMatchingSignature, ""},
		{"garbage signature", []string{testSecret}, hdr(id, ts, "v1,!!!"), body, time.Minute, now, ErrNoMatchingSignature, "no v1 signature"},
		{"too old", []string{testSecret}, hdr(id, ts, sig1), body, time.Minute, now.Add(2 * time.Minute), ErrTimestampOutOfTolerance, ""},
		{"too new", []string{testSecret}, hdr(id, ts, sig1), body, time.Minute, now.Add(-2 * time.Minute), ErrTimestampOutOfTolerance, ""},
		{"bad timestamp", []string{testSecret}, hdr(id, "soon", sig1), body, time.Minute, now, ErrInvalidTimestamp, ""},
		{"missing id", []string{testSecret}, hdr("", ts, sig1), body, time.Minute, now, ErrMissingHeaders, ""},
		{"missing signature", []string{testSecret}, hdr(id, ts, ""), body, time.Minute, now, ErrMissingHeaders, ""},
		{"no secrets", nil, hdr(id, ts, sig1), body, time.Minute, now, ErrNoSecrets, ""},
		{"bad whsec secret", []string{"whsec_***"}, hdr(id, ts, sig1), body, time.Minute, now, nil, "not valid base64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Verify(tt.secrets, tt.h, tt.body, tt.tol, tt.now)
			switch {
			case tt.want == nil && tt.wantMsg == "":
				if err != nil {
					t.Fatalf("Verify = %v, want nil", err)
				}
			case tt.want != nil && !errors.Is(err, tt.want):
				t.Fatalf("Verify = %v, want %v", err, tt.want)
			case tt.wantMsg != "" && (err == nil || !strings.Contains(err.Error(), tt.wantMsg)):
				t.Fatalf("Verify = %v, want it to contain %q", err, tt.wantMsg)
			}
		})
	}
}

func TestSendSingle(t *testing.T) {
	for _, canonical := range []bool{false, true} {
		t.Run(fmt.Sprintf("canonical=%v", canonical), func(t *testing.T) {
			srv, rc := newServer(t, nil)
			w := newSink(t, Config{
				URL: srv.URL + "/hook?token=abc", Secrets: []string{testSecret, testSecret2},
				AllowPrivateNetworks: true, Canonical: canonical,
			})
			w.now = func() time.Time { return t0 }
			e := testEvent(t, 1)
			if err := w.Send(context.Background(), []*event.Event{e}); err != nil {
				t.Fatalf("Send: %v", err)
			}
			reqs := rc.requests()
			if len(reqs) != 1 {
				t.Fatalf("got %d requests, want 1", len(reqs))
			}
			r := reqs[0]
			want := envelope(t, e, canonical)
			if string(r.body) != string(want) {
				t.Errorf("body = %s, want the cached envelope %s", r.body, want)
			}
			ts := strconv.FormatInt(t0.Unix(), 10)
			for k, v := range map[string]string{
				"Content-Type":      "application/json",
				"User-Agent":        DefaultUserAgent,
				"webhook-id":        e.ID,
				"webhook-timestamp": ts,
				"webhook-signature": independentSig(t, testSecret, e.ID, ts, want) + " " + independentSig(t, testSecret2, e.ID, ts, want),
				"Content-Length":    strconv.Itoa(len(want)),
			} {
				if got := r.header.Get(k); got != v {
					t.Errorf("header %s = %q, want %q", k, got, v)
				}
			}
			for _, secrets := range [][]string{{testSecret}, {testSecret2}} {
				if err := Verify(secrets, r.header, r.body, time.Minute, t0); err != nil {
					t.Errorf("Verify with %d secret(s): %v", len(secrets), err)
				}
			}
			if r.path != "/hook" {
				t.Errorf("path = %q", r.path)
			}
		})
	}
}

func TestSendUnsigned(t *testing.T) {
	srv, rc := newServer(t, nil)
	w := newSink(t, Config{URL: srv.URL, AllowPrivateNetworks: true})
	if err := w.Send(context.Background(), []*event.Event{testEvent(t, 1)}); err != nil {
		t.Fatal(err)
	}
	r := rc.requests()[0]
	if r.header.Get("webhook-signature") != "" || r.header.Get("webhook-timestamp") == "" || r.header.Get("webhook-id") == "" {
		t.Fatalf("headers %v: want id and timestamp but no signature", r.header)
	}
}

func TestSendBatch(t *testing.T) {
	srv, rc := newServer(t, nil)
	w := newSink(t, Config{URL: srv.URL, Secrets: []string{testSecret}, BatchSize: 3, AllowPrivateNetworks: true})
	if w.MaxBatch() != 3 {
		t.Fatalf("MaxBatch = %d", w.MaxBatch())
	}
	evs := []*event.Event{testEvent(t, 1), testEvent(t, 2), testEvent(t, 3)}
	for _, b := range [][]*event.Event{evs, evs, evs[:2], evs[2:]} {
		if err := w.Send(context.Background(), b); err != nil {
			t.Fatalf("Send: %v", err)
		}
	}
	reqs := rc.requests()
	if len(reqs) != 4 {
		t.Fatalf("got %d requests, want 4", len(reqs))
	}
	var arr []json.RawMessage
	if err := json.Unmarshal(reqs[0].body, &arr); err != nil {
		t.Fatalf("body is not a JSON array: %v\n%s", err, reqs[0].body)
	}
	if len(arr) != 3 {
		t.Fatalf("array has %d elements, want 3", len(arr))
	}
	for i, raw := range arr {
		if string(raw) != string(envelope(t, evs[i], false)) {
			t.Errorf("element %d = %s, want envelope %s", i, raw, envelope(t, evs[i], false))
		}
	}
	ids := []string{reqs[0].header.Get("webhook-id"), reqs[1].header.Get("webhook-id"), reqs[2].header.Get("webhook-id"), reqs[3].header.Get("webhook-id")}
	if want := BatchID([]string{evs[0].ID, evs[1].ID, evs[2].ID}); ids[0] != want || !strings.HasPrefix(want, "batch_") {
		t.Errorf("webhook-id = %q, want %q", ids[0], want)
	}
	if ids[0] != ids[1] {
		t.Errorf("same batch got different ids %q, %q", ids[0], ids[1])
	}
	if ids[2] == ids[0] || ids[3] == ids[0] || ids[2] == ids[3] {
		t.Errorf("different batches share an id: %q", ids)
	}
	// A batch of one is still an array.
	if err := json.Unmarshal(reqs[3].body, &arr); err != nil || len(arr) != 1 {
		t.Errorf("batch of one: %v, %d elements: %s", err, len(arr), reqs[3].body)
	}
	for i, r := range reqs {
		if err := Verify([]string{testSecret}, r.header, r.body, 0, time.Now()); err != nil {
			t.Errorf("request %d: Verify: %v", i, err)
		}
	}
}

func TestBatchID(t *testing.T) {
	a := BatchID([]string{"s:1", "s:2"})
	for _, other := range [][]string{{"s:2", "s:1"}, {"s:1"}, {"s:1s:2"}, {"s:1", "s:2", ""}} {
		if BatchID(other) == a {
			t.Errorf("BatchID(%q) == BatchID([s:1 s:2])", other)
		}
	}
	if a != BatchID([]string{"s:1", "s:2"}) || len(a) != len("batch_")+24 {
		t.Errorf("BatchID not stable or wrong length: %q", a)
	}
	// The documented derivation, computed independently: receivers
	// de-duplicate on it across releases.
	sum := sha256.Sum256([]byte("s:1\x00s:2\x00"))
	if want := "batch_" + base64.RawURLEncoding.EncodeToString(sum[:18]); a != want {
		t.Errorf("BatchID = %q, want %q", a, want)
	}
}

// TestSendNonBatchingSeveral covers a non-batching sink given several
// events: one request each, failures reported per entry.
func TestSendNonBatchingSeveral(t *testing.T) {
	srv, rc := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.Header.Get("webhook-id"), "0000000000000002") {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	w := newSink(t, Config{URL: srv.URL, AllowPrivateNetworks: true})
	err := w.Send(context.Background(), []*event.Event{testEvent(t, 1), testEvent(t, 2), testEvent(t, 3)})
	var be *sinks.BatchError
	if !errors.As(err, &be) || len(be.Failed) != 1 || be.Failed[1] == nil {
		t.Fatalf("Send = %v, want a BatchError for entry 1", err)
	}
	if de := asSinkError(t, be.Failed[1]); !de.Permanent || de.Reason != "http_400" {
		t.Errorf("entry 1: %+v", de)
	}
	if n := len(rc.requests()); n != 3 {
		t.Errorf("%d requests, want 3", n)
	}
}

func TestHeadersAndAuth(t *testing.T) {
	tests := []struct {
		name  string
		cfg   Config
		check func(t *testing.T, r *http.Request)
	}{
		{"custom headers and user agent", Config{Headers: map[string]string{"x-tenant": "acme", "X-Api-Key": "k1"}, UserAgent: "ua/1"}, func(t *testing.T, r *http.Request) {
			if r.Header.Get("X-Tenant") != "acme" || r.Header.Get("X-Api-Key") != "k1" || r.UserAgent() != "ua/1" {
				t.Errorf("headers %v", r.Header)
			}
			if r.Header.Get("Authorization") != "" {
				t.Errorf("unexpected Authorization")
			}
		}},
		{"custom authorization header", Config{Headers: map[string]string{"Authorization": "Token xyz"}}, func(t *testing.T, r *http.Request) {
			if got := r.Header.Get("Authorization"); got != "Token xyz" {
				t.Errorf("Authorization = %q", got)
			}
		}},
		{"bearer", Config{BearerToken: "s3cr3t"}, func(t *testing.T, r *http.Request) {
			if got := r.Header.Get("Authorization"); got != "Bearer s3cr3t" {
				t.Errorf("Authorization = %q", got)
			}
		}},
		{"basic", Config{BasicUser: "alice", BasicPassword: "p:w"}, func(t *testing.T, r *http.Request) {
			u, p, ok := r.BasicAuth()
			if !ok || u != "alice" || p != "p:w" {
				t.Errorf("BasicAuth = %q %q %v", u, p, ok)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got *http.Request
			srv, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) { got = r.Clone(context.Background()) })
			tt.cfg.URL = srv.URL
			tt.cfg.AllowPrivateNetworks = true
			w := newSink(t, tt.cfg)
			if err := w.Send(context.Background(), []*event.Event{testEvent(t, 1)}); err != nil {
				t.Fatal(err)
			}
			tt.check(t, got)
		})
	}
}

func TestNewErrors(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want []string
	}{
		{"no url", Config{}, []string{"webhook x: url is required"}},
		{"bad scheme", Config{URL: "ftp://example.com/x"}, []string{`scheme must be http or https, got "ftp"`}},
		{"no host", Config{URL: "https:///x"}, []string{"url: no host"}},
		{"unparsable", Config{URL: "http://a b/"}, []string{"url: invalid character"}},
		{"negative values", Config{URL: "https://example.com", Timeout: -1, BatchSize: -1, MaxConns: -2}, []string{
			"timeout must not be negative", "batch_size must be >= 1, got -1", "max_conns must be >= 1, got -2",
		}},
		{"bearer and basic", Config{URL: "https://example.com", BearerToken: "t", BasicUser: "u"}, []string{"bearer_token and basic auth are exclusive"}},
		{"bad secret", Config{URL: "https://example.com", Secrets: []string{testSecret, "whsec_%%%"}}, []string{"secrets[1]: secret starts with \"whsec_\" but the rest is not valid base64"}},
		{"empty secret", Config{URL: "https://example.com", Secrets: []string{""}}, []string{"secrets[0]: empty secret"}},
		{"short secrets", Config{URL: "https://example.com", Secrets: []string{"k", "whsec_c2hvcnQ"}}, []string{"secrets[0]: the key is 1 bytes, want at least 24 random bytes"}},
		{"reserved header", Config{URL: "https://example.com", Headers: map[string]string{"webhook-id": "x"}}, []string{"headers: Webhook-Id is set by the sink and cannot be overridden"}},
		{"bad header name", Config{URL: "https://example.com", Headers: map[string]string{"bad name": "x"}}, []string{`headers: "bad name" is not a valid header name`}},
		{"header injection", Config{URL: "https://example.com", Headers: map[string]string{"X-A": "a\r\nX-B: b"}}, []string{"headers: value of X-A contains a line break"}},
		{"authorization conflict", Config{URL: "https://example.com", BearerToken: "t", Headers: map[string]string{"authorization": "x"}}, []string{"Authorization conflicts"}},
		{"missing CA file", Config{URL: "https://example.com", TLSCAFile: "/nonexistent/ca.pem"}, []string{"tls_ca_file: open /nonexistent/ca.pem"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Name = "x"
			_, err := New(tt.cfg, nil)
			if err == nil {
				t.Fatal("New succeeded, want an error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "MfKQ9r8") {
				t.Errorf("error reveals a secret: %v", err)
			}
		})
	}
}

func TestStatusClassification(t *testing.T) {
	dateIn30s := t0.Add(30 * time.Second).Format(http.TimeFormat)
	tests := []struct {
		status     int
		retryAfter string
		wantOK     bool
		permanent  bool
		wantAfter  time.Duration
	}{
		{200, "", true, false, 0},
		{201, "", true, false, 0},
		{202, "", true, false, 0},
		{204, "", true, false, 0},
		{301, "", false, true, 0},
		{302, "", false, true, 0},
		{307, "", false, true, 0},
		{400, "", false, true, 0},
		{401, "", false, true, 0},
		{403, "", false, true, 0},
		{404, "", false, true, 0},
		{408, "", false, false, 0},
		{408, "3", false, false, 3 * time.Second},
		{409, "", false, true, 0},
		{410, "", false, true, 0},
		{413, "", false, true, 0},
		{422, "", false, true, 0},
		{429, "", false, false, 0},
		{429, "7", false, false, 7 * time.Second},
		{429, dateIn30s, false, false, 30 * time.Second},
		{429, "garbage", false, false, 0},
		{429, "-5", false, false, 0},
		{429, t0.Add(-time.Hour).Format(http.TimeFormat), false, false, 0},
		{500, "", false, false, 0},
		{501, "", false, false, 0},
		{502, "", false, false, 0},
		{503, "", false, false, 0},
		{503, "120", false, false, 120 * time.Second},
		{503, dateIn30s, false, false, 30 * time.Second},
		{504, "", false, false, 0},
		{400, "60", false, true, 0}, // Retry-After is irrelevant to a permanent failure
	}
	for _, tt := range tests {
		name := strconv.Itoa(tt.status)
		if tt.retryAfter != "" {
			name += " retry-after " + tt.retryAfter
		}
		t.Run(name, func(t *testing.T) {
			srv, rc := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				if tt.retryAfter != "" {
					w.Header().Set("Retry-After", tt.retryAfter)
				}
				if tt.status >= 300 && tt.status < 400 {
					w.Header().Set("Location", "/elsewhere")
				}
				w.WriteHeader(tt.status)
				fmt.Fprintf(w, "status %d body", tt.status)
			})
			w := newSink(t, Config{URL: srv.URL, AllowPrivateNetworks: true})
			w.now = func() time.Time { return t0 }
			err := w.Send(context.Background(), []*event.Event{testEvent(t, 1)})
			if n := len(rc.requests()); n != 1 {
				t.Errorf("server got %d requests, want 1 (statuses are not retried by the transport)", n)
			}
			if tt.wantOK {
				if err != nil {
					t.Fatalf("Send = %v, want nil", err)
				}
				return
			}
			de := asSinkError(t, err)
			if de.Permanent != tt.permanent {
				t.Errorf("Permanent = %v, want %v (%v)", de.Permanent, tt.permanent, err)
			}
			if want := "http_" + strconv.Itoa(tt.status); de.Reason != want {
				t.Errorf("Reason = %q, want %q", de.Reason, want)
			}
			if !tt.permanent && de.RetryAfter != tt.wantAfter {
				t.Errorf("RetryAfter = %v, want %v", de.RetryAfter, tt.wantAfter)
			}
			if want := fmt.Sprintf("status %d body", tt.status); de.Status != tt.status || de.Answer != want {
				t.Errorf("Status, Answer = %d, %q; want %d, %q", de.Status, de.Answer, tt.status, want)
			}
			msg := err.Error()
			for _, want := range []string{"webhook test: POST " + srv.URL + ": HTTP " + strconv.Itoa(tt.status), fmt.Sprintf("status %d body", tt.status)} {
				if !strings.Contains(msg, want) {
					t.Errorf("message %q does not contain %q", msg, want)
				}
			}
		})
	}
}

func TestRedirectNotFollowed(t *testing.T) {
	var followed atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("/hook", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/moved", http.StatusFound)
	})
	mux.HandleFunc("/moved", func(w http.ResponseWriter, r *http.Request) { followed.Add(1) })
	srv := httptest.NewServer(mux)
	defer srv.Close()
	w := newSink(t, Config{URL: srv.URL + "/hook", AllowPrivateNetworks: true})
	err := w.Send(context.Background(), []*event.Event{testEvent(t, 1)})
	de := asSinkError(t, err)
	if !de.Permanent || de.Reason != "http_302" || !strings.Contains(err.Error(), "redirect to "+DisplayURL(mustParse(t, srv.URL+"/moved"))+" not followed") {
		t.Errorf("Send = %v (%+v), want a permanent http_302 saying the redirect is not followed", err, de)
	}
	if followed.Load() != 0 {
		t.Errorf("redirect was followed")
	}
}

func TestPrivateTargetRefused(t *testing.T) {
	srv, rc := newServer(t, nil)
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	for _, u := range []string{srv.URL, fmt.Sprintf("http://localhost:%d/x", port)} {
		t.Run(u, func(t *testing.T) {
			w := newSink(t, Config{URL: u})
			err := w.Send(context.Background(), []*event.Event{testEvent(t, 1)})
			de := asSinkError(t, err)
			if !de.Permanent || de.Reason != "forbidden_target" || !errors.Is(err, ErrForbiddenTarget) {
				t.Fatalf("Send = %v (%+v), want permanent forbidden_target", err, de)
			}
			for _, want := range []string{fmt.Sprintf(":%d, a loopback address", port), "allow_private_networks = true"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("message %q does not contain %q", err, want)
				}
			}
		})
	}
	if n := len(rc.requests()); n != 0 {
		t.Fatalf("server got %d requests from a refused sink", n)
	}
	w := newSink(t, Config{URL: srv.URL, AllowPrivateNetworks: true})
	if err := w.Send(context.Background(), []*event.Event{testEvent(t, 1)}); err != nil {
		t.Fatalf("allowed: Send = %v", err)
	}
}

func TestClassifyAddr(t *testing.T) {
	tests := []struct {
		addr string
		want string
	}{
		{"127.0.0.1", "loopback"},
		{"127.8.9.10", "loopback"},
		{"::1", "loopback"},
		{"::ffff:127.0.0.1", "loopback"},
		{"10.1.2.3", "private"},
		{"172.16.0.1", "private"},
		{"172.31.255.255", "private"},
		{"192.168.1.1", "private"},
		{"fc00::1", "private"},
		{"fd12:3456::1", "private"},
		{"::ffff:10.0.0.1", "private"},
		{"169.254.1.1", "link-local"},
		{"fe80::1", "link-local"},
		{"fe80::1%eth0", "link-local"},
		{"169.254.169.254", "cloud metadata"},
		{"fd00:ec2::254", "cloud metadata"},
		{"100.100.100.200", "cloud metadata"},
		{"0.0.0.0", "unspecified"},
		{"0.1.2.3", "unspecified"},
		{"::", "unspecified"},
		{"100.64.0.1", "shared (CGNAT)"},
		{"100.127.255.254", "shared (CGNAT)"},
		{"224.0.0.1", "multicast"},
		{"239.1.1.1", "multicast"},
		{"ff02::1", "multicast"},
		{"255.255.255.255", "broadcast"},
		{"64:ff9b::7f00:1", "loopback (via NAT64)"},
		{"64:ff9b::a9fe:a9fe", "cloud metadata (via NAT64)"},
		{"8.8.8.8", ""},
		{"1.1.1.1", ""},
		{"100.63.255.255", ""},
		{"100.128.0.0", ""},
		{"172.32.0.1", ""},
		{"2606:4700:4700::1111", ""},
		{"64:ff9b::808:808", ""},
	}
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			if got := classifyAddr(netip.MustParseAddr(tt.addr)); got != tt.want {
				t.Errorf("classifyAddr(%s) = %q, want %q", tt.addr, got, tt.want)
			}
		})
	}
	if err := guardControl("tcp4", "8.8.8.8:443", nil); err != nil {
		t.Errorf("guardControl(public) = %v", err)
	}
	if err := guardControl("tcp6", "[::1]:443", nil); !errors.Is(err, ErrForbiddenTarget) {
		t.Errorf("guardControl(::1) = %v", err)
	}
}

// TestSpecialPurposeRanges: every range of the IANA special-purpose
// registries is refused, at its first and last address, and the gaps the
// review found are closed; addresses just outside stay allowed.
func TestSpecialPurposeRanges(t *testing.T) {
	for _, r := range specialRanges {
		first := r.prefix.Masked().Addr()
		last := first
		for a := first; r.prefix.Contains(a); a = a.Next() {
			last = a
			if a.BitLen()-r.prefix.Bits() > 8 {
				// Large ranges: jump to the last address directly.
				b := first.AsSlice()
				for i := r.prefix.Bits(); i < a.BitLen(); i++ {
					b[i/8] |= 1 << (7 - i%8)
				}
				last, _ = netip.AddrFromSlice(b)
				break
			}
		}
		for _, a := range []netip.Addr{first, last} {
			t.Run(r.prefix.String()+"/"+a.String(), func(t *testing.T) {
				if k := classifyAddr(a); k == "" {
					t.Errorf("classifyAddr(%s) allowed, in %s (%s)", a, r.prefix, r.kind)
				}
			})
		}
	}
	for _, tt := range []struct{ addr, want string }{
		{"::10.0.0.1", "IPv4-compatible (deprecated)"},
		{"::8.8.8.8", "IPv4-compatible (deprecated)"},
		{"2002:a00:1::1", "private (via 6to4)"},
		{"2002:7f00:1::1", "loopback (via 6to4)"},
		{"2002:a9fe:a9fe::1", "cloud metadata (via 6to4)"},
		{"2001:0:4136:e378:8000:63bf:f5ff:fffe", "Teredo"}, // client 10.0.0.1
		{"fec0::1", "site-local (deprecated)"},
		{"198.18.0.1", "benchmarking"},
		{"198.19.255.255", "benchmarking"},
		{"240.0.0.1", "reserved"},
		{"192.0.0.9", "IETF protocol assignment"},
		{"2001:db8::1", "documentation"},
		{"2001:2::1", "IETF protocol assignment"},
		{"64:ff9b:1::a00:1", "local-use NAT64"},
		{"100::1", "discard-only"},
		{"3fff::1", "documentation"},
		{"::ffff:0:a00:1", "IPv4-translated"},
		// Public neighbours stay allowed.
		{"2002:808:808::1", ""},
		{"198.17.255.255", ""},
		{"198.20.0.0", ""},
		{"239.255.255.255", "multicast"},
		{"223.255.255.255", ""},
		{"2001:200::1", ""},
		{"2620:4f:8001::1", ""},
	} {
		if got := classifyAddr(netip.MustParseAddr(tt.addr)); got != tt.want {
			t.Errorf("classifyAddr(%s) = %q, want %q", tt.addr, got, tt.want)
		}
	}
}

// dropFirstConn is a listener that closes its first connection at once,
// so that the client sees a transport error on its first attempt.
type dropFirstConn struct {
	net.Listener
	accepted atomic.Int32
}

func (l *dropFirstConn) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.accepted.Add(1) == 1 {
			c.(*net.TCPConn).SetLinger(0) // reset, not a graceful close
			c.Close()
			continue
		}
		return c, nil
	}
}

// startDropFirstConn starts a test server for h whose first connection is
// reset; it returns the server (closed at the end of the test) and its
// listener, which counts the connections.
func startDropFirstConn(t *testing.T, h http.Handler) (*httptest.Server, *dropFirstConn) {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	ln := &dropFirstConn{Listener: srv.Listener}
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, ln
}

// TestTransportRetryResigns checks that go-retryablehttp's own retry of a
// failed connection carries a fresh timestamp and signature.
func TestTransportRetryResigns(t *testing.T) {
	rc := &recorder{}
	srv, ln := startDropFirstConn(t, rc)

	w := newSink(t, Config{URL: srv.URL, Secrets: []string{testSecret}, AllowPrivateNetworks: true})
	var calls atomic.Int32
	w.now = func() time.Time { return t0.Add(time.Duration(calls.Add(1)-1) * 10 * time.Second) }
	e := testEvent(t, 1)
	if err := w.Send(context.Background(), []*event.Event{e}); err != nil {
		t.Fatalf("Send: %v", err)
	}
	if n := ln.accepted.Load(); n != 2 {
		t.Fatalf("listener accepted %d connections, want 2 (one dropped, one retried)", n)
	}
	reqs := rc.requests()
	if len(reqs) != 1 {
		t.Fatalf("server got %d requests, want 1", len(reqs))
	}
	r := reqs[0]
	wantTS := strconv.FormatInt(t0.Add(10*time.Second).Unix(), 10)
	if got := r.header.Get("webhook-timestamp"); got != wantTS {
		t.Errorf("retried request's timestamp = %s, want %s (re-signed on retry)", got, wantTS)
	}
	if got, want := r.header.Get("webhook-signature"), independentSig(t, testSecret, e.ID, wantTS, r.body); got != want {
		t.Errorf("signature = %s, want %s", got, want)
	}
	if r.header.Get("webhook-id") != e.ID {
		t.Errorf("webhook-id changed on retry: %s", r.header.Get("webhook-id"))
	}
}

// TestResignedPerSend checks that each engine attempt (Send) is signed
// with its own timestamp, under the same id.
func TestResignedPerSend(t *testing.T) {
	srv, rc := newServer(t, nil)
	w := newSink(t, Config{URL: srv.URL, Secrets: []string{testSecret}, AllowPrivateNetworks: true})
	w.now = clock(t0, 7*time.Second)
	e := testEvent(t, 1)
	for range 3 {
		if err := w.Send(context.Background(), []*event.Event{e}); err != nil {
			t.Fatal(err)
		}
	}
	reqs := rc.requests()
	seen := map[string]bool{}
	for i, r := range reqs {
		ts := r.header.Get("webhook-timestamp")
		if want := strconv.FormatInt(t0.Add(time.Duration(i)*7*time.Second).Unix(), 10); ts != want {
			t.Errorf("attempt %d: timestamp %s, want %s", i, ts, want)
		}
		sig := r.header.Get("webhook-signature")
		if seen[sig] {
			t.Errorf("attempt %d reused a signature", i)
		}
		seen[sig] = true
		if r.header.Get("webhook-id") != e.ID {
			t.Errorf("attempt %d: id %s", i, r.header.Get("webhook-id"))
		}
		if err := Verify([]string{testSecret}, r.header, r.body, time.Second, t0.Add(time.Duration(i)*7*time.Second)); err != nil {
			t.Errorf("attempt %d: %v", i, err)
		}
	}
}

func TestTransportErrorRetryable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: connection refused
	w := newSink(t, Config{URL: "http://" + addr + "/x?token=secret", AllowPrivateNetworks: true})
	err = w.Send(context.Background(), []*event.Event{testEvent(t, 1)})
	de := asSinkError(t, err)
	if de.Permanent || de.Reason != "transport" {
		t.Fatalf("Send = %v (%+v), want retryable transport", err, de)
	}
	if strings.Contains(err.Error(), "token=secret") {
		t.Errorf("message reveals the query string: %v", err)
	}
	if !strings.Contains(err.Error(), "webhook test: POST http://"+addr+"/[path sha256:") {
		t.Errorf("message %q lacks the redacted target", err)
	}
}

func mustParse(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestDisplayURL: a URL's path and query, which can carry a secret, never
// appear in messages: only scheme, host and a fingerprint of the path.
func TestDisplayURL(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"https://example.com", "https://example.com"},
		{"https://example.com/", "https://example.com/"},
		{"https://u:pw@example.com:8443/", "https://example.com:8443/"},
		{"https://hooks.slack.com/services/T000/B000/XXXXSECRET", "https://hooks.slack.com/[path sha256:"},
		{"https://example.com/?token=abc", "https://example.com/[path sha256:"},
	} {
		got := DisplayURL(mustParse(t, tt.in))
		if !strings.HasPrefix(got, tt.want) || strings.Contains(got, "SECRET") || strings.Contains(got, "abc") || strings.Contains(got, "pw") {
			t.Errorf("DisplayURL(%s) = %s, want %s…", tt.in, got, tt.want)
		}
	}
	a := DisplayURL(mustParse(t, "https://h/a"))
	b := DisplayURL(mustParse(t, "https://h/b"))
	if a == b {
		t.Errorf("different paths, same display %s", a)
	}
}

// TestPathSecretNotInMessages: with the token in the URL path, no error of
// any outcome class (HTTP status, redirect, transport, refused target)
// names it.
func TestPathSecretNotInMessages(t *testing.T) {
	const secret = "T0001/B0002/pathSECRETtoken"
	srv, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, r.URL.Path+"/again", http.StatusFound)
	})
	w := newSink(t, Config{URL: srv.URL + "/services/" + secret, AllowPrivateNetworks: true})
	err := w.Send(context.Background(), []*event.Event{testEvent(t, 1)})
	if err == nil || strings.Contains(err.Error(), "SECRET") {
		t.Errorf("redirect: %v", err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	w = newSink(t, Config{URL: "http://" + addr + "/services/" + secret, AllowPrivateNetworks: true})
	if err := w.Send(context.Background(), []*event.Event{testEvent(t, 1)}); err == nil || strings.Contains(err.Error(), "SECRET") {
		t.Errorf("transport: %v", err)
	}
	w = newSink(t, Config{URL: "http://" + addr + "/services/" + secret})
	if err := w.Send(context.Background(), []*event.Event{testEvent(t, 1)}); err == nil || strings.Contains(err.Error(), "SECRET") {
		t.Errorf("refused target: %v", err)
	}
}

func TestTimeout(t *testing.T) {
	release := make(chan struct{})
	srv, rc := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release) // before srv.Close (cleanups run after defers)
	w := newSink(t, Config{URL: srv.URL, Timeout: 150 * time.Millisecond, AllowPrivateNetworks: true})
	start := time.Now()
	err := w.Send(context.Background(), []*event.Event{testEvent(t, 1)})
	de := asSinkError(t, err)
	if de.Permanent || de.Reason != "timeout" {
		t.Fatalf("Send = %v (%+v), want retryable timeout", err, de)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Send took %v with a 150ms timeout", d)
	}
	if n := len(rc.requests()); n != 1 {
		t.Errorf("server got %d requests, want 1 (timeouts are left to the engine)", n)
	}
}

func TestContextCanceled(t *testing.T) {
	srv, _ := newServer(t, nil)
	w := newSink(t, Config{URL: srv.URL, AllowPrivateNetworks: true})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := w.Send(ctx, []*event.Event{testEvent(t, 1)})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Send = %v, want context.Canceled", err)
	}
	if _, ok := sinks.Classify(err); ok {
		t.Errorf("Classify treats cancellation as a delivery failure")
	}
}

func TestLargeResponseBody(t *testing.T) {
	big := strings.Repeat("E", 1<<20)
	var conns atomic.Int32
	rc := &recorder{respond: func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/fail" {
			w.WriteHeader(http.StatusInternalServerError)
			io.WriteString(w, big)
			return
		}
		io.WriteString(w, big[:32<<10]) // 200 with 32 KiB: drained, connection reused
	}}
	srv := httptest.NewUnstartedServer(rc)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()

	w := newSink(t, Config{URL: srv.URL + "/ok", AllowPrivateNetworks: true})
	for range 5 {
		if err := w.Send(context.Background(), []*event.Event{testEvent(t, 1)}); err != nil {
			t.Fatal(err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("5 sequential sends used %d connections, want 1", n)
	}

	wf := newSink(t, Config{URL: srv.URL + "/fail", AllowPrivateNetworks: true})
	err := wf.Send(context.Background(), []*event.Event{testEvent(t, 1)})
	de := asSinkError(t, err)
	if de.Permanent || de.Reason != "http_500" {
		t.Fatalf("Send = %+v", de)
	}
	if n := len(err.Error()); n > 700 {
		t.Errorf("error message is %d bytes, want the body snippet capped", n)
	}
	if !strings.HasSuffix(err.Error(), strings.Repeat("E", 100)+"...") {
		t.Errorf("message does not end with a truncated snippet: %q", err.Error()[len(err.Error())-120:])
	}
}

func TestSnippetSanitised(t *testing.T) {
	srv, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		w.Write([]byte("line1\nline2\x00\xff  "))
	})
	w := newSink(t, Config{URL: srv.URL, AllowPrivateNetworks: true})
	err := w.Send(context.Background(), []*event.Event{testEvent(t, 1)})
	if want := "HTTP 400 Bad Request: line1 line2 \uFFFD"; !strings.HasSuffix(err.Error(), want) {
		t.Errorf("message %q, want suffix %q", err, want)
	}
}

func TestTLS(t *testing.T) {
	rc := &recorder{}
	srv := httptest.NewTLSServer(rc)
	defer srv.Close()
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		cfg        Config
		wantReason string // "" = success
	}{
		{"unknown CA is refused", Config{}, "tls"},
		{"CA file", Config{TLSCAFile: caFile}, ""},
		{"insecure skip verify", Config{TLSInsecureSkipVerify: true}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(rc.requests())
			tt.cfg.URL = srv.URL
			tt.cfg.AllowPrivateNetworks = true
			w := newSink(t, tt.cfg)
			err := w.Send(context.Background(), []*event.Event{testEvent(t, 1)})
			if tt.wantReason == "" {
				if err != nil {
					t.Fatalf("Send = %v", err)
				}
				if len(rc.requests()) != before+1 {
					t.Fatalf("no request received")
				}
				return
			}
			de := asSinkError(t, err)
			if de.Permanent || de.Reason != tt.wantReason {
				t.Fatalf("Send = %v (%+v), want retryable %s", err, de, tt.wantReason)
			}
		})
	}
}

func TestSendAfterClose(t *testing.T) {
	srv, _ := newServer(t, nil)
	w := newSink(t, Config{URL: srv.URL, AllowPrivateNetworks: true})
	w.Close()
	if err := w.Send(context.Background(), []*event.Event{testEvent(t, 1)}); err == nil {
		t.Fatal("Send after Close succeeded")
	}
}

// TestConcurrentSend exercises the pooled signer and shared headers under
// the race detector.
func TestConcurrentSend(t *testing.T) {
	srv, rc := newServer(t, nil)
	w := newSink(t, Config{URL: srv.URL, Secrets: []string{testSecret, testSecret2}, AllowPrivateNetworks: true, MaxConns: 8})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 25 {
				if err := w.Send(context.Background(), []*event.Event{testEvent(t, g*100+i)}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	reqs := rc.requests()
	if len(reqs) != 200 {
		t.Fatalf("%d requests, want 200", len(reqs))
	}
	for _, r := range reqs {
		if err := Verify([]string{testSecret2}, r.header, r.body, time.Minute, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
}

// bigEvent is testEvent with a note of n bytes.
func bigEvent(tb testing.TB, i, n int) *event.Event {
	tb.Helper()
	raw, err := bson.Marshal(bson.D{
		{Key: "_id", Value: bson.D{{Key: "_data", Value: fmt.Sprintf("8266%016X", i)}}},
		{Key: "operationType", Value: "insert"},
		{Key: "clusterTime", Value: bson.Timestamp{T: 1_700_000_000, I: uint32(i)}},
		{Key: "ns", Value: bson.D{{Key: "db", Value: "shop"}, {Key: "coll", Value: "orders"}}},
		{Key: "documentKey", Value: bson.D{{Key: "_id", Value: int32(i)}}},
		{Key: "fullDocument", Value: bson.D{{Key: "_id", Value: int32(i)}, {Key: "note", Value: strings.Repeat("x", n)}}},
	})
	if err != nil {
		tb.Fatal(err)
	}
	e, err := event.FromChange("orders", uint64(i), raw)
	if err != nil {
		tb.Fatal(err)
	}
	return e
}

// limitedReceiver answers 413 to bodies over limit bytes and records the
// event ids of the bodies it accepts, and the sizes of every request.
type limitedReceiver struct {
	limit    int
	mu       sync.Mutex
	accepted map[string]int
	sizes    []int
}

func (l *limitedReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sizes = append(l.sizes, len(body))
	if len(body) > l.limit {
		http.Error(w, "too large", http.StatusRequestEntityTooLarge)
		return
	}
	var envs []struct{ ID string }
	if err := json.Unmarshal(body, &envs); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	for _, e := range envs {
		l.accepted[e.ID]++
	}
}

// TestBatchBytesAnd413: batches are cut at max_request_bytes; a 413 splits
// a batch and retries the parts, so only an event the receiver refuses on
// its own is given up (the review saw a 2 MB document take a small one into
// the dead letters).
func TestBatchBytesAnd413(t *testing.T) {
	rcv := &limitedReceiver{limit: 1 << 20, accepted: map[string]int{}}
	srv := httptest.NewServer(rcv)
	t.Cleanup(srv.Close)

	// Bytes cap: 30 small events and a 600 KiB one under a 256 KiB cap. The
	// big one alone is over the cap: dead-lettered (oversize =
	// "deadletter"), or sent stripped ("strip"); the others in requests
	// within the cap.
	for _, strip := range []bool{false, true} {
		rcv.accepted, rcv.sizes = map[string]int{}, nil
		var stripped, refused atomic.Int64
		w := newSink(t, Config{URL: srv.URL, BatchSize: 31, MaxRequestBytes: 256 << 10, AllowPrivateNetworks: true,
			Oversize: sinks.Oversize{Strip: strip, Stripped: incFunc(stripped.Add), Refused: incFunc(refused.Add)}})
		batch := []*event.Event{}
		for i := range 30 {
			batch = append(batch, testEvent(t, i))
		}
		batch = append(batch[:15], append([]*event.Event{bigEvent(t, 100, 600<<10)}, batch[15:]...)...)
		err := w.Send(context.Background(), batch)
		want, wantStripped, wantRefused := 31, int64(1), int64(0)
		if strip {
			if err != nil {
				t.Fatalf("strip: Send: %v", err)
			}
		} else {
			var be *sinks.BatchError
			if !errors.As(err, &be) || len(be.Failed) != 1 || be.Failed[15] == nil {
				t.Fatalf("deadletter: Send = %v, want a BatchError naming only the big event", err)
			}
			if de := asSinkError(t, be.Failed[15]); !de.Permanent || de.Reason != "oversize" ||
				!strings.Contains(de.Error(), "more than the request limit of 262144 bytes (max_request_bytes)") {
				t.Errorf("big event: %+v, want a permanent oversize", de)
			}
			want, wantStripped, wantRefused = 30, 0, 1
		}
		if len(rcv.accepted) != want {
			t.Errorf("strip %v: %d events accepted, want %d", strip, len(rcv.accepted), want)
		}
		if stripped.Load() != wantStripped || refused.Load() != wantRefused {
			t.Errorf("strip %v: counted %d stripped, %d refused; want %d, %d", strip, stripped.Load(), refused.Load(), wantStripped, wantRefused)
		}
		for _, n := range rcv.sizes {
			if n > 256<<10 {
				t.Errorf("strip %v: a request of %d bytes, over the cap", strip, n)
			}
		}
	}

	// 413: the receiver takes at most 64 KiB; a 2 MB event is refused on
	// its own, every small one is delivered.
	rcv.limit, rcv.accepted, rcv.sizes = 64<<10, map[string]int{}, nil
	w := newSink(t, Config{URL: srv.URL, BatchSize: 500, MaxRequestBytes: 4 << 20, AllowPrivateNetworks: true})
	var batch []*event.Event
	for i := range 300 {
		batch = append(batch, testEvent(t, i))
	}
	big := bigEvent(t, 1000, 2<<20)
	batch = append(batch[:7], append([]*event.Event{big}, batch[7:]...)...)
	err := w.Send(context.Background(), batch)
	var be *sinks.BatchError
	if !errors.As(err, &be) || len(be.Failed) != 1 || be.Failed[7] == nil {
		t.Fatalf("Send = %v, want a BatchError naming only the big event", err)
	}
	if de := asSinkError(t, be.Failed[7]); !de.Permanent || de.Reason != "http_413" {
		t.Errorf("big event: %+v, want a permanent http_413", de)
	}
	if len(rcv.accepted) != 300 || rcv.accepted[big.ID] != 0 {
		t.Errorf("%d events accepted (big one %d times), want the 300 small ones", len(rcv.accepted), rcv.accepted[big.ID])
	}
	for id, n := range rcv.accepted {
		if n != 1 {
			t.Errorf("%s accepted %d times", id, n)
		}
	}
}

// incFunc adapts an atomic Add to sinks.Counter.
type incFunc func(int64) int64

func (f incFunc) Inc() { f(1) }

// A webhook that does not batch applies max_request_bytes to each request:
// an event over it is refused without a request (deadletter) or sent
// stripped; an event within it is sent whole.
func TestOversizeSingle(t *testing.T) {
	var mu sync.Mutex
	var bodies [][]byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, b)
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	small, big := testEvent(t, 1), bigEvent(t, 2, 64<<10)

	w := newSink(t, Config{URL: srv.URL, MaxRequestBytes: 4096, AllowPrivateNetworks: true})
	if err := w.Send(context.Background(), []*event.Event{small}); err != nil {
		t.Fatalf("small event: %v", err)
	}
	err := w.Send(context.Background(), []*event.Event{big})
	if de := asSinkError(t, err); !de.Permanent || de.Reason != "oversize" || !strings.Contains(de.Error(), big.ID) {
		t.Fatalf("big event: %v, want a permanent oversize naming it", err)
	}
	if len(bodies) != 1 {
		t.Fatalf("%d requests, want 1 (none for the oversize event)", len(bodies))
	}

	var stripped atomic.Int64
	w = newSink(t, Config{URL: srv.URL, MaxRequestBytes: 4096, AllowPrivateNetworks: true,
		Oversize: sinks.Oversize{Strip: true, Stripped: incFunc(stripped.Add)}})
	if err := w.Send(context.Background(), []*event.Event{big}); err != nil {
		t.Fatalf("big event, strip: %v", err)
	}
	got := string(bodies[len(bodies)-1])
	if strings.Contains(got, "fullDocument") || !strings.HasSuffix(got, `,"truncated":true}`) || !strings.Contains(got, `"documentKey":{"_id":2}`) {
		t.Errorf("stripped body: %s", got)
	}
	if stripped.Load() != 1 {
		t.Errorf("counted %d stripped, want 1", stripped.Load())
	}
}

// A receiver's reason phrase carrying terminal escapes (a title change
// ESC]0;...BEL, a screen clear ESC[2J) reaches the error text, and so
// dead letters and the CLI, without its control characters.
func TestReasonPhraseControlCharacters(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
					return
				}
				_, _ = io.WriteString(c, "HTTP/1.1 400 Bad\x1b]0;pwned\x07\x1b[2J Request\r\nContent-Length: 12\r\nConnection: close\r\n\r\nbody\x1b[31mred")
			}()
		}
	}()
	err = newSink(t, Config{URL: "http://" + ln.Addr().String() + "/", AllowPrivateNetworks: true}).Send(context.Background(), []*event.Event{testEvent(t, 1)})
	de := asSinkError(t, err)
	msg := err.Error()
	if !de.Permanent || strings.ContainsAny(msg, "\x1b\x07") || !strings.Contains(msg, "HTTP 400 Bad ]0;pwned  [2J Request: body [31mred") {
		t.Fatalf("error %q (permanent %v): want the reason phrase and body without control characters", msg, de.Permanent)
	}
}
