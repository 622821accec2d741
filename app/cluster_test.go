package app_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/checkpoint"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/test/mongotest"
	"github.com/changegate/changegate/test/receiver"
)

// clusterConfig is configText with 4 partitions and cluster mode under
// instance %INSTANCE%, with a short lease ttl.
const clusterConfig = `
[mongo]
uri = "%URI%"
state_database = "%STATE%"

[server]
listen = "127.0.0.1:0"
shutdown_grace = "5s"
public_read = true

[cluster]
enabled = true
lease_ttl = "3s"
renew_every = "500ms"
instance = "%INSTANCE%"

[[sources]]
name = "items"
database = "%DB%"
collection = "items"
checkpoint_interval = "50ms"
max_await = "100ms"
partitions = 4

[[sinks]]
name = "hook"
type = "webhook"
url = "%URL%"
allow_private_networks = true

[[rules]]
name = "all"
source = "items"
sinks = ["hook"]
`

type unitView struct {
	Name  string `json:"name"`
	Owner string `json:"owner"`
	Epoch int64  `json:"epoch"`
	Role  string `json:"role"`
}

type statusView struct {
	Ready    bool       `json:"ready"`
	Instance string     `json:"instance"`
	Units    []unitView `json:"units"`
	Sources  []struct {
		Name  string `json:"name"`
		State string `json:"state"`
	} `json:"sources"`
}

func status(t *testing.T, g *gateway) statusView {
	t.Helper()
	resp, err := http.Get("http://" + g.admin + "/api/v1/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var s statusView
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

func active(s statusView) []unitView {
	var out []unitView
	for _, u := range s.Units {
		if u.Role == "active" {
			out = append(out, u)
		}
	}
	return out
}

// TestClusterTwoGateways: two gateways in cluster mode on one MongoDB
// split 4 partitions 2 and 2 (the first takes all, then hands two over
// when the second joins); when one stops, the other takes its units over
// from their checkpoints within about a second (released, not expired);
// every change is delivered, none lost; and the stopped replica's epoch
// can no longer move a checkpoint (fencing).
func TestClusterTwoGateways(t *testing.T) {
	e := newEnv(t)
	rcv := receiver.New()
	t.Cleanup(rcv.Close)
	cfgOf := func(instance string) *config.Config {
		text := strings.NewReplacer("%URI%", e.uri, "%DB%", e.db, "%STATE%", e.state, "%URL%", rcv.URL(), "%INSTANCE%", instance).Replace(clusterConfig)
		cfg, err := config.Parse("cluster.toml", []byte(text), func(string) (string, bool) { return "", false })
		if err != nil {
			t.Fatalf("config: %v", err)
		}
		return cfg
	}

	a := start(t, cfgOf("a"), app.Options{})
	waitFor(t, 10*time.Second, "a to own all 4 units", func() bool { return len(active(status(t, a))) == 4 })
	// Its 4 streams are open (ready) before the first write: a first
	// start begins at "now".
	waitFor(t, 10*time.Second, "a ready with 4 streams open", func() bool {
		s := status(t, a)
		if !s.Ready || len(s.Sources) != 4 {
			return false
		}
		for _, src := range s.Sources {
			if src.State != "open" {
				return false
			}
		}
		return true
	})

	// Continuous writes, each document recorded once written.
	var mu sync.Mutex
	written := 0
	writeCtx, stopWriting := context.WithCancel(context.Background())
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		for writeCtx.Err() == nil {
			if err := e.insert(); err != nil {
				t.Errorf("insert: %v", err)
				return
			}
			mu.Lock()
			written++
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()
	t.Cleanup(func() { stopWriting(); <-writerDone })

	b := start(t, cfgOf("b"), app.Options{}) // ready as a standby
	waitFor(t, 10*time.Second, "2 units each", func() bool {
		return len(active(status(t, a))) == 2 && len(active(status(t, b))) == 2
	})
	bUnits := active(status(t, b))
	for _, u := range bUnits {
		if u.Owner != "b" || u.Epoch < 2 {
			t.Fatalf("b's unit %+v: want owner b and an epoch above a's first", u)
		}
	}

	// Graceful stop of b: a owns all 4 again within about a second.
	time.Sleep(300 * time.Millisecond)
	if err := b.stop(t, 10*time.Second); err != nil {
		t.Fatalf("b: %v", err)
	}
	stopped := time.Now()
	waitFor(t, 5*time.Second, "a to own all 4 units again", func() bool { return len(active(status(t, a))) == 4 })
	if d := time.Since(stopped); d > 2500*time.Millisecond {
		t.Errorf("handover took %v; released leases should be taken within a round", d)
	}
	time.Sleep(300 * time.Millisecond)
	stopWriting()
	<-writerDone

	// Nothing lost: every written document was delivered.
	mu.Lock()
	n := written
	mu.Unlock()
	missing := func() []int {
		seen := map[string]bool{}
		for _, d := range rcv.Deliveries() {
			seen[d.DocKey] = true
		}
		var out []int
		for i := 1; i <= n; i++ {
			if !seen[fmt.Sprintf(`{"_id":%d}`, i)] {
				out = append(out, i)
			}
		}
		return out
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(missing()) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if m := missing(); len(m) > 0 {
		var keys []string
		for _, d := range rcv.Deliveries()[:min(5, rcv.Count())] {
			keys = append(keys, d.DocKey)
		}
		t.Fatalf("%d of %d documents never delivered: %v (delivered keys look like %v)", len(m), n, m, keys)
	}

	// Fencing: b's epoch can no longer save the checkpoint of a unit a
	// now owns.
	client := mongotest.Client(t, e.uri)
	cps := checkpoint.NewStore(client.Database(e.state), "checkpoints")
	u := bUnits[0]
	cp, ok, err := cps.Load(context.Background(), u.Name)
	if err != nil || !ok {
		t.Fatalf("checkpoint of %s: %v %v", u.Name, ok, err)
	}
	stale := checkpoint.Checkpoint{Source: u.Name, Token: cp.Token, Epoch: u.Epoch}
	if err := cps.Save(context.Background(), stale); !errors.Is(err, checkpoint.ErrFenced) {
		t.Fatalf("save with b's epoch %d after a took %s over: %v, want ErrFenced", u.Epoch, u.Name, err)
	}
	var leases []bson.M
	cur, err := client.Database(e.state).Collection("leases").Find(context.Background(), bson.D{})
	if err != nil || cur.All(context.Background(), &leases) != nil {
		t.Fatal(err)
	}
	if len(leases) != 4+2 { // 4 units and 2 members
		t.Errorf("lease collection: %v", leases)
	}
}
