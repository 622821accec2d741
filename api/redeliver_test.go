package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/changegate/changegate/api"
	"github.com/changegate/changegate/backfill"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/router"
	"github.com/changegate/changegate/source"
)

// backfills is an api.Backfills whose redelivery answers err, recording
// what it was asked.
type backfills struct {
	err      error
	id, sink string
}

func (b *backfills) Start(context.Context, *config.Config, backfill.Request) (backfill.Status, error) {
	return backfill.Status{}, nil
}
func (b *backfills) List() []backfill.Status            { return nil }
func (b *backfills) Get(string) (backfill.Status, bool) { return backfill.Status{}, false }
func (b *backfills) Cancel(context.Context, string) (backfill.Status, error) {
	return backfill.Status{}, nil
}
func (b *backfills) RedeliverEvent(_ context.Context, id, sink string) (backfill.Redelivered, error) {
	b.id, b.sink = id, sink
	if b.err != nil {
		return backfill.Redelivered{}, b.err
	}
	return backfill.Redelivered{ID: id, Sink: sink, State: "delivered", Rules: []string{"all"}}, nil
}

// POST /api/v1/events/{id}/redeliver answers each outcome of a redelivery
// with its status: delivered 200, a bad request 400, an unknown sink or a
// change the oplog lacks 404, a change no current rule routes to the sink
// or a parked sink 409, a change rolled off the oplog 410, a sink that did
// not take it 502; the admin token only.
func TestRedeliverEventAPI(t *testing.T) {
	const token = "the-admin-token-0123"
	for _, tc := range []struct {
		name  string
		body  string
		err   error
		token string
		want  int
	}{
		{"delivered", `{"sink": "hook"}`, nil, token, 200},
		{"no sink", `{}`, nil, token, 400},
		{"not json", `sink=hook`, nil, token, 400},
		{"unknown field", `{"sink": "hook", "since": "x"}`, nil, token, 400},
		{"no token", `{"sink": "hook"}`, nil, "", 401},
		{"snapshot id", `{"sink": "hook"}`, fmt.Errorf("%w: holds no position", backfill.ErrInput), token, 400},
		{"unknown sink", `{"sink": "hook"}`, fmt.Errorf("%w %q", backfill.ErrUnknownSink, "hook"), token, 404},
		{"no such change", `{"sink": "hook"}`, fmt.Errorf("%w: not there", backfill.ErrNoChange), token, 404},
		{"not routed", `{"sink": "hook"}`, fmt.Errorf("sink hook: %w", deadletter.ErrNotRouted), token, 409},
		{"parked", `{"sink": "hook"}`, fmt.Errorf("sink hook: %w", router.ErrParked), token, 409},
		{"rolled off", `{"sink": "hook"}`, fmt.Errorf("%w: x: %w", backfill.ErrGone, source.ErrHistoryLost), token, 410},
		{"refused", `{"sink": "hook"}`, fmt.Errorf("%w: x", backfill.ErrDelivery), token, 502},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bf := &backfills{err: tc.err}
			srv := api.New(api.Options{Gateway: gateway{cfg: &config.Config{Server: config.Server{AdminToken: token}}}, Backfills: bf})
			req := httptest.NewRequest("POST", "/api/v1/events/items:82AB/redeliver", strings.NewReader(tc.body))
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			w := httptest.NewRecorder()
			srv.ServeHTTP(w, req)
			if w.Code != tc.want {
				t.Fatalf("status %d, want %d: %s", w.Code, tc.want, w.Body)
			}
			var out map[string]any
			if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
				t.Fatalf("answer %s: %v", w.Body, err)
			}
			switch {
			case tc.want == 200:
				if out["state"] != "delivered" || bf.id != "items:82AB" || bf.sink != "hook" {
					t.Errorf("answer %v, asked %q %q", out, bf.id, bf.sink)
				}
			case tc.err != nil && out["error"] != tc.err.Error():
				t.Errorf("error %v, want %q", out["error"], tc.err)
			}
		})
	}
}
