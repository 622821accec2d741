package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/test/mongowire"
	"github.com/changegate/changegate/test/receiver"
)

const tenMiB = 10 * 1024 * 1024

// largeHead is the config head of the large-event tests: the usual source,
// with post- and pre-images.
const largeHead = itemsHead + `full_document = "updateLookup"
full_document_before_change = "required"
`

// TestLargeEventSplitAndStripped: a 10 MiB document updated to another
// 10 MiB value, with updateLookup and pre-images (about 30 MiB of change
// event), reaches a webhook that accepts 64 MiB bodies whole and
// byte-identical (reassembled from the server's fragments); reaches
// EventBridge per its policy (oversize = "strip": the insert goes without
// its document; the update still carries 10 MiB in updatedFields, so it goes
// with updatedFields replaced by {"truncated": true} too); is dead-lettered
// for SQS (oversize = "deadletter", the default); and later small changes
// keep flowing to every sink. A crash between fragments is
// TestProcessKillBetweenFragments.
func TestLargeEventSplitAndStripped(t *testing.T) {
	w := newAWSWorld(t)
	ctx := context.Background()
	err := w.e.client.Database(w.e.db).CreateCollection(ctx, "items",
		options.CreateCollection().SetChangeStreamPreAndPostImages(bson.M{"enabled": true}))
	if err != nil {
		t.Fatal(err)
	}
	cfg := w.e.config(largeHead + fmt.Sprintf(`
[[sinks]]
name = "hook"
type = "webhook"
url = %q
secret = "${TEST_SECRET}"
allow_private_networks = true
timeout = "60s"
max_request_bytes = 67108864

[[sinks]]
name = "bus"
type = "eventbridge"
event_bus = "orders"
endpoint = %q
oversize = "strip"

[[sinks]]
name = "audit"
type = "sqs"
queue_url = %q
endpoint = %q

[[rules]]
name = "hooks"
source = "items"
sinks = ["hook"]

[[rules]]
name = "aws"
source = "items"
sinks = ["bus", "audit"]
`, w.rcv.URL(), w.eb.URL(), w.url, w.sqs.URL()))
	g := w.e.start(cfg)
	c := w.e.coll("items")
	oldV, newV := strings.Repeat("x", tenMiB), strings.Repeat("y", tenMiB)
	if _, err := c.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}, {Key: "v", Value: oldV}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: newV}}}}); err != nil {
		t.Fatal(err)
	}
	insertN(t, c, 2, 5) // later small changes

	waitFor(t, 60*time.Second, "the update and the small inserts at the webhook", func() bool {
		ops := map[string]bool{}
		for _, d := range w.rcv.Deliveries() {
			ops[d.Operation+d.DocKey] = true
		}
		return ops[`update{"_id":1}`] && ops[`insert{"_id":6}`]
	})
	var update json.RawMessage
	for _, d := range w.rcv.Deliveries() {
		if d.Operation == "update" {
			update = d.Envelope
		}
	}
	var env struct {
		FullDocument             json.RawMessage `json:"fullDocument"`
		FullDocumentBeforeChange json.RawMessage `json:"fullDocumentBeforeChange"`
		Truncated                bool            `json:"truncated"`
	}
	if err := json.Unmarshal(update, &env); err != nil {
		t.Fatal(err)
	}
	if want := `{"_id":1,"v":"` + newV + `"}`; string(env.FullDocument) != want {
		t.Fatalf("webhook fullDocument is %d bytes, not the updated document", len(env.FullDocument))
	}
	if want := `{"_id":1,"v":"` + oldV + `"}`; string(env.FullDocumentBeforeChange) != want || env.Truncated {
		t.Fatalf("webhook pre-image is %d bytes (truncated %v)", len(env.FullDocumentBeforeChange), env.Truncated)
	}
	for _, d := range w.rcv.Deliveries() {
		if strings.Contains(string(d.Envelope), `"splitEvent"`) {
			t.Fatal("a fragment reached the webhook")
		}
	}

	waitFor(t, 60*time.Second, "the events at EventBridge", func() bool {
		n := 0
		for _, ev := range w.eb.Events() {
			if strings.Contains(ev.Detail, `"documentKey":{"_id":1}`) || strings.Contains(ev.Detail, `"documentKey":{"_id":6}`) {
				n++
			}
		}
		return n >= 3
	})
	for _, ev := range w.eb.Events() {
		var v struct {
			OperationType     string          `json:"operationType"`
			DocumentKey       json.RawMessage `json:"documentKey"`
			FullDocument      json.RawMessage `json:"fullDocument"`
			UpdateDescription *struct {
				UpdatedFields json.RawMessage `json:"updatedFields"`
			} `json:"updateDescription"`
			Truncated bool `json:"truncated"`
		}
		if err := json.Unmarshal([]byte(ev.Detail), &v); err != nil {
			t.Fatal(err)
		}
		big := string(v.DocumentKey) == `{"_id":1}`
		if big && (!v.Truncated || v.FullDocument != nil) {
			t.Fatalf("eventbridge got the large %s event unstripped", v.OperationType)
		}
		if big && v.OperationType == "update" && (v.UpdateDescription == nil || string(v.UpdateDescription.UpdatedFields) != `{"truncated":true}`) {
			t.Fatalf("eventbridge got the large update without its updatedFields truncated: %.300s", ev.Detail)
		}
		if !big && (v.Truncated || v.FullDocument == nil) {
			t.Fatalf("eventbridge stripped a small event: %s", ev.Detail)
		}
	}

	waitFor(t, 30*time.Second, "the small events at SQS", func() bool {
		for _, m := range w.sqs.Messages("audit.fifo") {
			if strings.Contains(m.Body, `"documentKey":{"_id":6}`) {
				return true
			}
		}
		return false
	})
	dls := w.e.client.Database(w.e.state).Collection("deadletters")
	waitFor(t, 30*time.Second, "the large events dead-lettered for SQS, and only those", func() bool {
		n, err := dls.CountDocuments(ctx, bson.D{{Key: "sink", Value: "audit"}, {Key: "reason", Value: "oversize"}})
		all, err2 := dls.CountDocuments(ctx, bson.D{})
		return err == nil && err2 == nil && n == 2 && all == 2
	})
	for _, m := range w.sqs.Messages("audit.fifo") {
		if strings.Contains(m.Body, `"documentKey":{"_id":1}`) {
			t.Fatalf("sqs got a large event: %.300s", m.Body)
		}
	}
	fams := scrape(t, g.admin)
	for _, c := range []struct {
		sink, action string
	}{{"bus", "strip"}, {"audit", "deadletter"}} {
		m := find(fams, "changegate_sink_oversize_events_total", map[string]string{"sink": c.sink, "action": c.action})
		if m == nil || m.GetCounter().GetValue() != 2 {
			t.Errorf("changegate_sink_oversize_events_total{sink=%q,action=%q} = %v, want 2", c.sink, c.action, m)
		}
	}
}

// TestProcessKillBetweenFragments runs the real binary, SIGKILLs it after it
// has read the first fragments of a split 30 MiB update and before the last
// one, restarts it, and checks that nothing is lost: the update reaches the
// webhook reassembled and byte-identical, and every change before and after
// it arrives. With test/mongowire the kill point is deterministic: the
// server holds the getMore that would return the last fragment
// (mongowire.Server.HoldFragment) until the process is dead. Against a real
// MongoDB (CHANGEGATE_TEST_MONGODB_URI) there is no such hold: the process
// is killed once the 10 MiB insert before the update is delivered, which is
// not necessarily between fragments.
func TestProcessKillBetweenFragments(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := changegateBinary(t)
	e := newEnv(t)
	ctx := context.Background()
	err := e.client.Database(e.db).CreateCollection(ctx, "items",
		options.CreateCollection().SetChangeStreamPreAndPostImages(bson.M{"enabled": true}))
	if err != nil {
		t.Fatal(err)
	}
	rcv := receiver.New(testSecret)
	t.Cleanup(rcv.Close)
	tmpl := hookConfig(largeHead, rcv.URL(), `secret = "${TEST_SECRET}"
timeout = "60s"
max_request_bytes = 67108864
`)
	cfgPath := filepath.Join(t.TempDir(), "config.toml")
	text := e.expand(tmpl)
	if err := os.WriteFile(cfgPath, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	var hold *mongowire.FragmentHold
	if e.srv != nil {
		hold = e.srv.HoldFragment(0)
		defer hold.Release()
	} else {
		t.Log("CHANGEGATE_TEST_MONGODB_URI is set: a real MongoDB cannot hold a getMore between fragments, " +
			"so the deterministic kill between fragments is skipped; the process is killed after the insert before the update instead")
	}

	p := startProcess(t, bin, cfgPath)
	cps, _ := e.stores(e.config(tmpl))
	waitFor(t, 20*time.Second, "the process to open its stream", func() bool {
		_, ok, _ := cps.Load(ctx, "items")
		return ok
	})
	c := e.coll("items")
	oldV, newV := strings.Repeat("x", tenMiB), strings.Repeat("y", tenMiB)
	insertN(t, c, 0, 3)
	if _, err := c.InsertOne(ctx, bson.D{{Key: "_id", Value: "big"}, {Key: "v", Value: oldV}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.UpdateOne(ctx, bson.D{{Key: "_id", Value: "big"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: newV}}}}); err != nil {
		t.Fatal(err)
	}
	insertN(t, c, 3, 3)

	var insertTok string // the 10 MiB insert's token data, once delivered
	delivered := func(op, key string) int {
		n := 0
		for _, d := range rcv.Deliveries() {
			if d.Operation == op && d.DocKey == key {
				n++
			}
		}
		return n
	}
	if hold != nil {
		select {
		case <-hold.Reached():
		case <-time.After(60 * time.Second):
			t.Fatalf("the process never asked for the last fragment\n%s", p.out)
		}
		// The process has read every fragment but the last: the update
		// cannot have been delivered. Let the insert before it be
		// delivered and checkpointed, so that a checkpoint taken between
		// fragments (a bug) would be persisted before the kill.
		waitFor(t, 60*time.Second, "the 10 MiB insert checkpointed", func() bool {
			for _, d := range rcv.Deliveries() {
				if d.Operation == "insert" && d.DocKey == `{"_id":"big"}` {
					insertTok = strings.TrimPrefix(d.ID, "items:")
				}
			}
			cp, ok, _ := cps.Load(ctx, "items")
			return ok && insertTok != "" && event.TokenData(cp.Token) >= insertTok
		})
		if n := delivered("update", `{"_id":"big"}`); n != 0 {
			t.Fatalf("the update was delivered %d times before its last fragment was read", n)
		}
	} else {
		waitFor(t, 60*time.Second, "the 10 MiB insert at the webhook", func() bool { return delivered("insert", `{"_id":"big"}`) > 0 })
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.cmd.Wait()
	var killCP bson.Raw // the checkpoint at the kill
	if hold != nil {
		cp, _, err := cps.Load(ctx, "items")
		if err != nil {
			t.Fatal(err)
		}
		if got := event.TokenData(cp.Token); got < insertTok {
			t.Fatalf("checkpoint at the kill is %s, before the delivered insert %s", got, insertTok)
		}
		killCP = cp.Token
		hold.Release()
	}

	startProcess(t, bin, cfgPath)
	waitFor(t, 90*time.Second, "every change after the restart", func() bool {
		if delivered("update", `{"_id":"big"}`) == 0 || delivered("insert", `{"_id":"big"}`) == 0 {
			return false
		}
		for i := range 6 {
			if delivered("insert", fmt.Sprintf(`{"_id":%d}`, i)) == 0 {
				return false
			}
		}
		return true
	})
	if killCP != nil {
		// Nothing between fragments was persisted: the checkpoint at the
		// kill is before the update. It may be past the insert before it
		// (a post-batch token after the state database's own writes), but
		// every fragment's token carries the update's cluster time, and
		// oplog entries have distinct times.
		for _, d := range rcv.Deliveries() {
			if d.Operation != "update" {
				continue
			}
			upd, err := bson.Marshal(bson.D{{Key: "_data", Value: strings.TrimPrefix(d.ID, "items:")}})
			if err != nil {
				t.Fatal(err)
			}
			uct, ok1 := event.TokenClusterTime(upd)
			kct, ok2 := event.TokenClusterTime(killCP)
			if !ok1 || !ok2 || !(kct.T < uct.T || kct.T == uct.T && kct.I < uct.I) {
				t.Fatalf("checkpoint at the kill %s is not before the update %s", event.TokenData(killCP), d.ID)
			}
		}
	}
	ids := map[string]string{} // webhook-id by change
	for _, d := range rcv.Deliveries() {
		if strings.Contains(string(d.Envelope), `"splitEvent"`) {
			t.Fatal("a fragment reached the webhook")
		}
		k := d.Operation + d.DocKey
		if id, ok := ids[k]; ok && id != d.WebhookID {
			t.Fatalf("%s re-delivered with webhook-id %s, first %s", k, d.WebhookID, id)
		}
		ids[k] = d.WebhookID
		if d.Operation != "update" {
			continue
		}
		var env struct {
			FullDocument             json.RawMessage `json:"fullDocument"`
			FullDocumentBeforeChange json.RawMessage `json:"fullDocumentBeforeChange"`
			Truncated                bool            `json:"truncated"`
		}
		if err := json.Unmarshal(d.Envelope, &env); err != nil {
			t.Fatal(err)
		}
		if want := `{"_id":"big","v":"` + newV + `"}`; string(env.FullDocument) != want || env.Truncated {
			t.Fatalf("update fullDocument is %d bytes (truncated %v), not the updated document", len(env.FullDocument), env.Truncated)
		}
		if want := `{"_id":"big","v":"` + oldV + `"}`; string(env.FullDocumentBeforeChange) != want {
			t.Fatalf("update pre-image is %d bytes, not the old document", len(env.FullDocumentBeforeChange))
		}
	}
}
