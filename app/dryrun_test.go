package app_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/changegate/changegate/app"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/test/mongotest"
)

// TestDryRunIsWhatTheWebhookReceives: the envelope a dry run shows for a
// sink is the body the sink, built as run builds it, posts for the event
// routed by the router's rules — relaxed and canonical, odd values
// included.
// dryRoute routes one change, given as Extended JSON, from source through
// the dry run of cfg, as its first event. It returns the change as BSON and
// the route.
func dryRoute(t *testing.T, cfg *config.Config, source, change string) (bson.Raw, *app.Routed) {
	t.Helper()
	var raw bson.Raw
	if err := bson.UnmarshalExtJSON([]byte(change), false, &raw); err != nil {
		t.Fatal(err)
	}
	dry, err := app.NewDryRun(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := dry.Route(source, 1, raw)
	if err != nil {
		t.Fatal(err)
	}
	return raw, rt
}

func TestDryRunIsWhatTheWebhookReceives(t *testing.T) {
	var mu sync.Mutex
	bodies := map[string][]byte{} // by path: /relaxed, /canonical
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies[r.URL.Path] = b
		mu.Unlock()
	}))
	defer hook.Close()
	cfg, err := config.Parse("dry.toml", []byte(fmt.Sprintf(`
[mongo]
uri = "mongodb://localhost:27017/?replicaSet=rs0"
[[sources]]
name = "orders"
database = "shop"
collection = "orders"
[[sinks]]
name = "relaxed"
type = "webhook"
url = "%[1]s/relaxed"
allow_private_networks = true
[[sinks]]
name = "canonical"
type = "webhook"
url = "%[1]s/canonical"
allow_private_networks = true
json = "canonical"
[[rules]]
name = "big"
source = "orders"
filter = { "fullDocument.total" = { "$gt" = 100 } }
sinks = ["relaxed", "canonical"]
[[rules]]
name = "inserts"
source = "orders"
operations = ["insert"]
sinks = ["canonical"]
`, hook.URL)), nil)
	if err != nil {
		t.Fatal(err)
	}
	change := `{"_id":{"_data":"8264F1A000000000012B022C0100296E5A1004"},"operationType":"insert",` +
		`"clusterTime":{"$timestamp":{"t":1700000000,"i":1}},"wallTime":{"$date":"2023-11-14T22:13:20.123Z"},` +
		`"ns":{"db":"shop","coll":"orders"},"documentKey":{"_id":{"$oid":"6553f2a0e4b0a1b2c3d4e5f6"}},` +
		`"fullDocument":{"_id":{"$oid":"6553f2a0e4b0a1b2c3d4e5f6"},"total":{"$numberDecimal":"100.01"},"n":{"$numberLong":"7"},` +
		`"x":{"$numberDouble":"NaN"},"d":{"$date":{"$numberLong":"-1"}},"b":{"$binary":{"base64":"AQI=","subType":"05"}},"s":"<&>\u2028"}}`
	raw, rt := dryRoute(t, cfg, "orders", change)
	if len(rt.Rules) != 2 || rt.Rules[0].Rule != "big" || rt.Rules[1].Rule != "inserts" || len(rt.Deliveries) != 2 {
		t.Fatalf("routed %+v; want rules big and inserts, two sinks", rt)
	}
	if got := strings.Join(rt.Deliveries[1].Rules, ","); rt.Deliveries[1].Sink.Name != "canonical" || got != "big,inserts" {
		t.Errorf("sink %s via %s; want canonical via big,inserts", rt.Deliveries[1].Sink.Name, got)
	}

	specs, err := app.BuildSinks(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := app.CompileRules(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range rt.Deliveries {
		// A fresh event, routed as the router routes it, sent by the sink.
		ev, err := event.FromChange("orders", 1, raw)
		if err != nil {
			t.Fatal(err)
		}
		ev.Rules = rules.Route(ev).Rules
		sk := specs[i].Sink
		if sk.Name() != d.Sink.Name {
			t.Fatalf("sink %d is %s, dry run says %s", i, sk.Name(), d.Sink.Name)
		}
		if err := sk.Send(context.Background(), []*event.Event{ev}); err != nil {
			t.Fatalf("send to %s: %v", sk.Name(), err)
		}
		_ = sk.Close()
		mu.Lock()
		got := bodies["/"+sk.Name()]
		mu.Unlock()
		if d.Err != nil || string(got) != string(d.Envelope) {
			t.Errorf("sink %s received\n%s\ndry run shows (err %v)\n%s", sk.Name(), got, d.Err, d.Envelope)
		}
	}
}

// TestDryRunPushdownAgreesWithTheStream: the dry run's verdict on the
// pushed-down $match (evaluated in changegate with the router's matcher)
// is what MongoDB's change stream does with the same stage: a change it
// says passes is the one the filtered stream returns. Against
// test/mongowire, or a real MongoDB with CHANGEGATE_TEST_MONGODB_URI.
func TestDryRunPushdownAgreesWithTheStream(t *testing.T) {
	db := mongotest.Database(t, "cgdry_")
	cfg, err := config.Parse("dry.toml", []byte(fmt.Sprintf(`
[mongo]
uri = "mongodb://localhost:27017/?replicaSet=rs0"
[[sources]]
name = "orders"
database = %q
collection = "orders"
full_document = "updateLookup"
[[sinks]]
name = "hook"
type = "webhook"
url = "https://example.com/hook"
[[rules]]
name = "paid"
source = "orders"
operations = ["insert", "update", "replace"]
filter = { "fullDocument.status" = "paid", "fullDocument.total" = { "$gte" = 100 } }
sinks = ["hook"]
[[rules]]
name = "deletes"
source = "orders"
operations = ["delete"]
filter = { "documentKey._id" = { "$in" = [2, 4] } }
sinks = ["hook"]
`, db.Name())), nil)
	if err != nil {
		t.Fatal(err)
	}
	dry, err := app.NewDryRun(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rules, err := app.CompileRules(cfg)
	if err != nil {
		t.Fatal(err)
	}
	stage, ok := rules.Pushdown("orders")
	if !ok {
		t.Fatal("no pushdown")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	coll := db.Collection("orders")
	opts := options.ChangeStream().SetFullDocument(options.UpdateLookup)
	all, err := coll.Watch(ctx, mongo.Pipeline{}, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer all.Close(ctx)
	filtered, err := coll.Watch(ctx, mongo.Pipeline{stage}, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer filtered.Close(ctx)

	writes := []func() error{
		func() error {
			_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}, {Key: "status", Value: "paid"}, {Key: "total", Value: 150}})
			return err
		},
		func() error {
			_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 2}, {Key: "status", Value: "open"}, {Key: "total", Value: 150}})
			return err
		},
		func() error {
			_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 3}, {Key: "status", Value: "paid"}, {Key: "total", Value: 99.5}})
			return err
		},
		func() error {
			_, err := coll.UpdateByID(ctx, 2, bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: "paid"}}}})
			return err
		},
		func() error {
			_, err := coll.UpdateByID(ctx, 3, bson.D{{Key: "$set", Value: bson.D{{Key: "note", Value: "x"}}}})
			return err
		},
		func() error {
			_, err := coll.ReplaceOne(ctx, bson.D{{Key: "_id", Value: 3}}, bson.D{{Key: "status", Value: "paid"}, {Key: "total", Value: bson.NewDecimal128(0x3040000000000000, 1000)}})
			return err
		},
		func() error { _, err := coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: 1}}); return err },
		func() error { _, err := coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: 2}}); return err },
		// The last change passes: once the filtered stream has it, it has
		// had its chance at every earlier one.
		func() error {
			_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 9}, {Key: "status", Value: "paid"}, {Key: "total", Value: 1000}})
			return err
		},
	}
	for i, w := range writes {
		if err := w(); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	read := func(cs *mongo.ChangeStream, n int, stop func(bson.Raw) bool) []bson.Raw {
		var out []bson.Raw
		for len(out) < n && cs.Next(ctx) {
			raw := append(bson.Raw(nil), cs.Current...)
			out = append(out, raw)
			if stop != nil && stop(raw) {
				break
			}
		}
		if err := cs.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	every := read(all, len(writes), nil)
	if len(every) != len(writes) {
		t.Fatalf("unfiltered stream: %d changes, want %d", len(every), len(writes))
	}
	last := event.TokenData(every[len(every)-1].Lookup("_id").Document())
	passed := map[string]bool{}
	for _, raw := range read(filtered, len(writes), func(raw bson.Raw) bool {
		return event.TokenData(raw.Lookup("_id").Document()) == last
	}) {
		passed[event.TokenData(raw.Lookup("_id").Document())] = true
	}
	wantPass := 0
	for i, raw := range every {
		rt, err := dry.Route("orders", uint64(i), raw)
		if err != nil {
			t.Fatal(err)
		}
		tok := event.TokenData(rt.Event.Token)
		if got := rt.Pushdown == app.PushdownPass; got != passed[tok] {
			t.Errorf("change %d (%s %s): dry run says pushdown %s, the filtered stream returned it: %v", i, rt.Event.OperationType, rt.Event.DocumentKey, rt.Pushdown, passed[tok])
		}
		if rt.Pushdown == app.PushdownPass {
			wantPass++
		}
		// What is routed passed the pushdown (the rules' union).
		if len(rt.Rules) > 0 && rt.Pushdown != app.PushdownPass {
			t.Errorf("change %d matched %v but the pushdown drops it", i, rt.Rules)
		}
	}
	// inserts 1, 9; update of 2 (now paid); replace of 3 (1000); delete of 2.
	if wantPass != 5 {
		t.Errorf("%d changes pass the pushdown, want 5", wantPass)
	}
}

// TestDryRunSourcesLeaveOutTheStateDatabase: a cluster source does not
// carry the changes of the state database (its stream leaves them out), so
// a dry run routes them nowhere; other databases' changes it carries.
func TestDryRunSourcesLeaveOutTheStateDatabase(t *testing.T) {
	cfg, err := config.Parse("dry.toml", []byte(`
[mongo]
uri = "mongodb://localhost:27017/?replicaSet=rs0"
state_database = "cgstate"
[[sources]]
name = "all"
[[sinks]]
name = "s"
type = "webhook"
url = "https://example.com/hook"
[[rules]]
name = "everything"
source = "all"
sinks = ["s"]
`), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	dry, err := app.NewDryRun(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := dry.Sources("cgstate", "deadletters"); len(got) != 0 {
		t.Errorf("sources of cgstate.deadletters = %v, want none", got)
	}
	if got := dry.Sources("shop", "orders"); len(got) != 1 || got[0] != "all" {
		t.Errorf("sources of shop.orders = %v, want [all]", got)
	}
}
