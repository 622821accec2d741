package e2e

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/test/receiver"
)

// TestReloadAppliesReadyMaxLag: a reload that changes server.ready_max_lag
// is accepted, so /readyz must judge by the new bound.
func TestReloadAppliesReadyMaxLag(t *testing.T) {
	e := newEnv(t)
	rcv := receiver.New(testSecret)
	t.Cleanup(rcv.Close)
	text := strings.Replace(baseConfig(rcv.URL(), `park_after = "1h"`), `shutdown_grace = "10s"`, `shutdown_grace = "1s"
ready_max_lag = "1h"`, 1)
	text = strings.Replace(text, `max_attempts = 4`, `max_attempts = 1000`, 1)
	cfg := e.config(text)
	var mu sync.Mutex
	next := cfg
	reload := make(chan struct{})
	g := e.startWith(cfg, app.Options{Reload: reload, LoadConfig: func() (*config.Config, error) {
		mu.Lock()
		defer mu.Unlock()
		return next, nil
	}})
	insertN(t, e.coll("items"), 0, 1)
	waitFor(t, 20*time.Second, "first delivery", func() bool { return rcv.Count() >= 1 })
	rcv.SetResponder(func([]byte) *receiver.Response { return &receiver.Response{Status: http.StatusServiceUnavailable} })
	insertN(t, e.coll("items"), 1, 1)
	readyz := func() int {
		resp, err := http.Get("http://" + g.admin + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	time.Sleep(1500 * time.Millisecond) // longer than the new bound
	if code := readyz(); code != http.StatusOK {
		t.Fatalf("readyz %d within ready_max_lag = 1h", code)
	}
	mu.Lock()
	next = e.config(strings.Replace(text, `ready_max_lag = "1h"`, `ready_max_lag = "1s"`, 1))
	mu.Unlock()
	reload <- struct{}{}
	waitFor(t, 10*time.Second, "readyz 503 under the reloaded ready_max_lag = 1s", func() bool {
		return readyz() == http.StatusServiceUnavailable
	})
	rcv.SetResponder(nil)
}
