package receive_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"go/parser"
	"go/token"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/receive"
	"github.com/changegate/changegate/sinks/webhook"
)

const (
	secretA = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	secretB = "whsec_c2Vjb25kLXNlY3JldC1vZi1hdC1sZWFzdC0yNC1ieXRlcw=="
)

// signed returns headers as changegate's webhook sink writes them, signed
// with webhook.Sign (the sink's own signing code) under secrets.
func signed(t *testing.T, id string, ts time.Time, body []byte, secrets ...string) http.Header {
	t.Helper()
	sig, err := webhook.Sign(secrets, id, ts, body)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	h.Set("webhook-id", id)
	h.Set("webhook-timestamp", strconv.FormatInt(ts.Unix(), 10))
	h.Set("webhook-signature", sig)
	return h
}

func TestVerify(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	body := []byte(`{"id":"orders:82AB","source":"orders","operationType":"insert","rules":["r"]}`)
	const id = "orders:82AB"
	cases := []struct {
		name    string
		secrets []string // the verifier's
		header  func() http.Header
		body    []byte
		want    error // nil: verifies
	}{
		{"valid", []string{secretA}, func() http.Header { return signed(t, id, now, body, secretA) }, body, nil},
		{"raw secret", []string{"a raw secret of at least 24 bytes"}, func() http.Header {
			return signed(t, id, now, body, "a raw secret of at least 24 bytes")
		}, body, nil},
		{"wrong secret", []string{secretB}, func() http.Header { return signed(t, id, now, body, secretA) }, body, receive.ErrSignature},
		{"tampered body", []string{secretA}, func() http.Header { return signed(t, id, now, body, secretA) },
			bytes.Replace(body, []byte("insert"), []byte("delete"), 1), receive.ErrSignature},
		{"tampered id", []string{secretA}, func() http.Header {
			h := signed(t, id, now, body, secretA)
			h.Set("webhook-id", "orders:82AC")
			return h
		}, body, receive.ErrSignature},
		{"tampered timestamp", []string{secretA}, func() http.Header {
			h := signed(t, id, now, body, secretA)
			h.Set("webhook-timestamp", strconv.FormatInt(now.Unix()+1, 10))
			return h
		}, body, receive.ErrSignature},
		{"stale timestamp", []string{secretA}, func() http.Header {
			return signed(t, id, now.Add(-receive.DefaultTolerance-time.Second), body, secretA)
		}, body, receive.ErrStale},
		{"timestamp from the future", []string{secretA}, func() http.Header {
			return signed(t, id, now.Add(receive.DefaultTolerance+time.Second), body, secretA)
		}, body, receive.ErrStale},
		{"within tolerance", []string{secretA}, func() http.Header {
			return signed(t, id, now.Add(-receive.DefaultTolerance+time.Second), body, secretA)
		}, body, nil},
		{"rotation: sender signs with both, receiver knows the new one", []string{secretB}, func() http.Header {
			return signed(t, id, now, body, secretA, secretB)
		}, body, nil},
		{"rotation: receiver knows both, sender signs with the old one", []string{secretB, secretA}, func() http.Header {
			return signed(t, id, now, body, secretA)
		}, body, nil},
		{"multiple signatures, other schemes and garbage ignored", []string{secretA}, func() http.Header {
			h := signed(t, id, now, body, secretA)
			h.Set("webhook-signature", "v1a,AAAA v1,notbase64!! v1,"+strings.Repeat("A", 44)+" "+h.Get("webhook-signature"))
			return h
		}, body, nil},
		{"signature in a second header line", []string{secretA}, func() http.Header {
			h := signed(t, id, now, body, secretA)
			sig := h.Get("webhook-signature")
			h.Set("webhook-signature", "v1,"+strings.Repeat("B", 44))
			h.Add("webhook-signature", sig)
			return h
		}, body, nil},
		{"only foreign signatures", []string{secretA}, func() http.Header {
			h := signed(t, id, now, body, secretA)
			h.Set("webhook-signature", "v1a,"+strings.Repeat("A", 86))
			return h
		}, body, receive.ErrSignature},
		{"missing id", []string{secretA}, func() http.Header {
			h := signed(t, id, now, body, secretA)
			h.Del("webhook-id")
			return h
		}, body, receive.ErrMissingHeaders},
		{"missing signature", []string{secretA}, func() http.Header {
			h := signed(t, id, now, body, secretA)
			h.Del("webhook-signature")
			return h
		}, body, receive.ErrMissingHeaders},
		{"timestamp not a number", []string{secretA}, func() http.Header {
			h := signed(t, id, now, body, secretA)
			h.Set("webhook-timestamp", "2026-11-23T10:00:00Z")
			return h
		}, body, receive.ErrInvalidTimestamp},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v, err := receive.NewVerifier(c.secrets...)
			if err != nil {
				t.Fatal(err)
			}
			v.Now = func() time.Time { return now }
			got, err := v.Verify(c.header(), c.body)
			if c.want == nil {
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				if got != id {
					t.Fatalf("id = %q, want %q", got, id)
				}
				return
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("Verify: err = %v, want %v", err, c.want)
			}
		})
	}
}

// TestVerifyAgreesWithSink checks both directions against sinks/webhook: a
// request the sink's Verify accepts is accepted here, and one it refuses is
// refused here.
func TestVerifyAgreesWithSink(t *testing.T) {
	now := time.Now()
	body := []byte(`[{"id":"a:1"},{"id":"a:2"}]`)
	for _, secrets := range [][]string{{secretA}, {secretB}, {secretA, secretB}} {
		h := signed(t, "batch_x", now, body, secrets...)
		for _, verifyWith := range []string{secretA, secretB} {
			v, _ := receive.NewVerifier(verifyWith)
			_, ours := v.Verify(h, body)
			theirs := webhook.Verify([]string{verifyWith}, h, body, receive.DefaultTolerance, now)
			if (ours == nil) != (theirs == nil) {
				t.Fatalf("signed with %d secret(s), verified with one: receive says %v, sinks/webhook says %v", len(secrets), ours, theirs)
			}
		}
	}
}

func TestNewVerifierBadSecret(t *testing.T) {
	if _, err := receive.NewVerifier(); err == nil {
		t.Fatal("no secrets: want an error")
	}
	_, err := receive.NewVerifier(secretA, "whsec_!!!")
	if err == nil || !strings.Contains(err.Error(), "secrets[1]") || strings.Contains(err.Error(), "!!!") {
		t.Fatalf("bad secret: err = %v, want one naming secrets[1] without echoing it", err)
	}
}

func TestRequest(t *testing.T) {
	v, _ := receive.NewVerifier(secretA)
	var got *receive.Message
	var gotErr error
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, gotErr = v.Request(r, 64)
		if gotErr != nil {
			http.Error(w, gotErr.Error(), receive.StatusFor(gotErr))
		}
	}))
	defer srv.Close()
	post := func(body []byte, h http.Header) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(body))
		req.Header = h
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	now := time.Now()
	body := []byte(`{"id":"s:1"}`)
	if code := post(body, signed(t, "s:1", now, body, secretA)); code != 200 || gotErr != nil {
		t.Fatalf("valid request: %d %v", code, gotErr)
	}
	if got.ID != "s:1" || string(got.Body) != string(body) || got.Timestamp.Unix() != now.Unix() {
		t.Fatalf("message = %+v", got)
	}
	if code := post(body, signed(t, "s:1", now, body, secretB)); code != http.StatusUnauthorized {
		t.Fatalf("wrong secret: status %d, want 401", code)
	}
	big := bytes.Repeat([]byte("x"), 65)
	if code := post(big, signed(t, "s:1", now, big, secretA)); code != http.StatusRequestEntityTooLarge || !errors.Is(gotErr, receive.ErrTooLarge) {
		t.Fatalf("65 bytes over a 64-byte limit: status %d err %v", code, gotErr)
	}
	if code := post(body, http.Header{}); code != http.StatusBadRequest {
		t.Fatalf("no headers: status %d, want 400", code)
	}
}

// change is a change event as the server sends it, for event.FromChange.
func change(t *testing.T) *event.Event {
	t.Helper()
	raw, err := bson.Marshal(bson.D{
		{Key: "_id", Value: bson.D{{Key: "_data", Value: "82654F0C5B000000012B0229296E04"}}},
		{Key: "operationType", Value: "update"},
		{Key: "clusterTime", Value: bson.Timestamp{T: 1_800_000_000, I: 1}},
		{Key: "wallTime", Value: bson.DateTime(1_800_000_000_123)},
		{Key: "ns", Value: bson.D{{Key: "db", Value: "shop"}, {Key: "coll", Value: "jobs"}}},
		{Key: "documentKey", Value: bson.D{{Key: "_id", Value: "job-1"}}},
		{Key: "fullDocument", Value: bson.D{{Key: "_id", Value: "job-1"}, {Key: "state", Value: "step1"}, {Key: "n", Value: int64(7)}}},
		{Key: "fullDocumentBeforeChange", Value: bson.D{{Key: "_id", Value: "job-1"}, {Key: "state", Value: "pending"}}},
		{Key: "updateDescription", Value: bson.D{
			{Key: "updatedFields", Value: bson.D{{Key: "state", Value: "step1"}, {Key: "a.b", Value: 1}}},
			{Key: "removedFields", Value: bson.A{"tmp"}},
			{Key: "truncatedArrays", Value: bson.A{}},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := event.FromChange("jobs", 1, raw)
	if err != nil {
		t.Fatal(err)
	}
	ev.Rules = []string{"to-step1"}
	return ev
}

// TestDecodeRealEnvelope decodes an envelope produced by changegate's own
// encoder.
func TestDecodeRealEnvelope(t *testing.T) {
	ev := change(t)
	body, err := ev.Envelope(false)
	if err != nil {
		t.Fatal(err)
	}
	env, err := receive.Decode(body)
	if err != nil {
		t.Fatal(err)
	}
	check := func(env receive.Envelope) {
		t.Helper()
		if env.ID != ev.ID || env.Source != "jobs" || env.OperationType != "update" || env.NS != (receive.Namespace{DB: "shop", Coll: "jobs"}) {
			t.Fatalf("envelope = %+v", env)
		}
		if !env.ClusterTime.Equal(time.Unix(1_800_000_000, 0)) || !env.WallTime.Equal(time.UnixMilli(1_800_000_000_123)) {
			t.Fatalf("times = %v %v", env.ClusterTime, env.WallTime)
		}
		if v, ok := env.Updated("state"); !ok || string(v) != `"step1"` {
			t.Fatalf("updatedFields.state = %s %v", v, ok)
		}
		if env.UpdateDescription.RemovedFields[0] != "tmp" || len(env.Rules) != 1 || env.Rules[0] != "to-step1" {
			t.Fatalf("envelope = %+v", env)
		}
		var doc struct {
			ID    string `json:"_id"`
			State string `json:"state"`
			N     int64  `json:"n"`
		}
		if err := json.Unmarshal(env.FullDocument, &doc); err != nil || doc != (struct {
			ID    string `json:"_id"`
			State string `json:"state"`
			N     int64  `json:"n"`
		}{"job-1", "step1", 7}) {
			t.Fatalf("fullDocument = %s (%v)", env.FullDocument, err)
		}
		var pre struct{ State string }
		if err := json.Unmarshal(env.FullDocumentBeforeChange, &pre); err != nil || pre.State != "pending" {
			t.Fatalf("fullDocumentBeforeChange = %s", env.FullDocumentBeforeChange)
		}
		if string(env.DocumentKey) != `{"_id":"job-1"}` {
			t.Fatalf("documentKey = %s", env.DocumentKey)
		}
	}
	check(env)

	// A batch body is an array of the same envelopes.
	batch := append(append(append([]byte("[\n"), body...), ','), body...)
	batch = append(batch, ']')
	envs, err := receive.DecodeBatch(batch)
	if err != nil || len(envs) != 2 {
		t.Fatalf("DecodeBatch: %d %v", len(envs), err)
	}
	check(envs[1])
	if one, err := receive.DecodeBatch(body); err != nil || len(one) != 1 {
		t.Fatalf("DecodeBatch of a single envelope: %d %v", len(one), err)
	}

	// EventBridge hands the Lambda the entry with the envelope as detail.
	eb := []byte(`{"version":"0","id":"6a7e8feb-b491-4cf7-a9f1-bf3703467718","detail-type":"shop.jobs.update",
		"source":"changegate.jobs","account":"111122223333","time":"2026-11-23T10:00:00Z","region":"us-east-1",
		"resources":[],"detail":` + string(body) + `}`)
	env, err = receive.FromEventBridge(eb)
	if err != nil {
		t.Fatal(err)
	}
	check(env)

	// An SQS record's body is the envelope (sqs sink) or an EventBridge
	// event (an EventBridge rule targeting the queue).
	sqsEvent, _ := json.Marshal(map[string]any{"Records": []map[string]any{
		{"messageId": "m1", "body": string(body), "eventSource": "aws:sqs",
			"messageAttributes": map[string]any{"source": map[string]string{"dataType": "String", "stringValue": "jobs"}}},
		{"messageId": "m2", "body": string(eb), "eventSource": "aws:sqs"},
	}})
	var se receive.SQSEvent
	if err := json.Unmarshal(sqsEvent, &se); err != nil {
		t.Fatal(err)
	}
	if len(se.Records) != 2 || se.Records[0].MessageAttributes["source"].StringValue != "jobs" {
		t.Fatalf("sqs event = %+v", se)
	}
	for _, r := range se.Records {
		env, err := r.Envelope()
		if err != nil {
			t.Fatalf("%s: %v", r.MessageID, err)
		}
		check(env)
	}
}

func TestDecodeErrors(t *testing.T) {
	for _, body := range []string{``, `{`, `{"source":"x"}`, `[{"id":"a"},{"source":"x"}]`, `"id"`} {
		if _, err := receive.DecodeBatch([]byte(body)); err == nil {
			t.Errorf("DecodeBatch(%q): no error", body)
		}
	}
	if _, err := receive.FromEventBridge([]byte(`{"detail-type":"x"}`)); err == nil {
		t.Error("eventbridge event without detail: no error")
	}
	if _, err := receive.FromSQSBody(`not json`); err == nil {
		t.Error("sqs body not json: no error")
	}
}

// TestStdlibOnly keeps the package free of dependencies: receivers import it
// without pulling in changegate's.
func TestStdlibOnly(t *testing.T) {
	files, _ := filepath.Glob("*.go")
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, src, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range af.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if first, _, _ := strings.Cut(p, "/"); strings.Contains(first, ".") {
				t.Errorf("%s imports %s: the package must use the standard library only", f, p)
			}
		}
	}
}
