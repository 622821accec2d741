package main

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/changegate/changegate/sinks/webhook"
)

const testSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

func signed(t *testing.T, secret, id, body string) *http.Request {
	t.Helper()
	now := time.Now()
	sig, err := webhook.Sign([]string{secret}, id, now, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPost, "/hook", strings.NewReader(body))
	r.Header.Set(webhook.HeaderID, id)
	r.Header.Set(webhook.HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	r.Header.Set(webhook.HeaderSignature, sig)
	return r
}

func newHandler(out io.Writer, secrets ...string) *handler {
	return &handler{secrets: secrets, tolerance: 5 * time.Minute, out: out,
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

func TestVerifiedEnvelopesArePrinted(t *testing.T) {
	var out bytes.Buffer
	h := newHandler(&out, "whsec_old", testSecret)

	w := httptest.NewRecorder()
	h.ServeHTTP(w, signed(t, testSecret, "orders:1", `{"id":"orders:1","operationType":"insert"}`))
	if w.Code != http.StatusNoContent {
		t.Fatalf("single envelope: status %d, body %q", w.Code, w.Body)
	}
	w = httptest.NewRecorder()
	h.ServeHTTP(w, signed(t, testSecret, "orders:2", `[{"id":"orders:2"},{"id":"orders:3"}]`))
	if w.Code != http.StatusNoContent {
		t.Fatalf("batch: status %d, body %q", w.Code, w.Body)
	}

	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("printed %d lines, want 3:\n%s", len(lines), out.String())
	}
	want := []struct{ webhookID, id string }{{"orders:1", "orders:1"}, {"orders:2", "orders:2"}, {"orders:2", "orders:3"}}
	for i, line := range lines {
		var got struct {
			WebhookID string `json:"webhook_id"`
			Envelope  struct {
				ID string `json:"id"`
			} `json:"envelope"`
		}
		if err := json.Unmarshal([]byte(line), &got); err != nil {
			t.Fatalf("line %d %q: %v", i, line, err)
		}
		if got.WebhookID != want[i].webhookID || got.Envelope.ID != want[i].id {
			t.Errorf("line %d = %+v, want %+v", i, got, want[i])
		}
	}
}

func TestRejectsBadSignatureAndBadJSON(t *testing.T) {
	var out bytes.Buffer
	h := newHandler(&out, testSecret)

	w := httptest.NewRecorder()
	h.ServeHTTP(w, signed(t, "whsec_"+strings.Repeat("A", 32), "x:1", `{"id":"x:1"}`))
	if w.Code != http.StatusUnauthorized {
		t.Errorf("wrong secret: status %d, want 401", w.Code)
	}
	w = httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, "/hook", strings.NewReader(`{"id":"x:1"}`))
	h.ServeHTTP(w, r)
	if w.Code != http.StatusUnauthorized {
		t.Errorf("unsigned: status %d, want 401", w.Code)
	}
	w = httptest.NewRecorder()
	h.ServeHTTP(w, signed(t, testSecret, "x:2", `not json`))
	if w.Code != http.StatusBadRequest {
		t.Errorf("bad json: status %d, want 400", w.Code)
	}
	if out.Len() != 0 {
		t.Errorf("printed rejected requests: %q", out.String())
	}
}

func TestNoSecretAcceptsUnsigned(t *testing.T) {
	var out bytes.Buffer
	h := newHandler(&out)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/hook", strings.NewReader(`{"id":"x:1"}`)))
	if w.Code != http.StatusNoContent || !strings.Contains(out.String(), `"x:1"`) {
		t.Fatalf("status %d, printed %q", w.Code, out.String())
	}
}

func TestSplitSecrets(t *testing.T) {
	got := splitSecrets(" a, ,b ,")
	if len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Fatalf("splitSecrets = %q", got)
	}
	if splitSecrets("") != nil {
		t.Fatal("empty input should give no secrets")
	}
}
