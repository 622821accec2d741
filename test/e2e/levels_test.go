package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/test/receiver"
)

// TestDatabaseAndClusterSources routes a database-level and a cluster-level
// source by namespace and operation: each sink gets exactly the changes its
// rules select, once, and the envelope (encoded once for every sink) names
// every rule of the source that matched, in config order.
func TestDatabaseAndClusterSources(t *testing.T) {
	e := newEnv(t)
	a := receiver.New(testSecret)
	t.Cleanup(a.Close)
	b := receiver.New(testSecret)
	t.Cleanup(b.Close)
	c := receiver.New(testSecret)
	t.Cleanup(c.Close)
	sink := func(name, url string) string {
		return fmt.Sprintf(`
[[sinks]]
name = %q
type = "webhook"
url = %q
secret = "${TEST_SECRET}"
allow_private_networks = true
`, name, url)
	}
	cfg := e.config(`
[mongo]
uri = "%URI%"
state_database = "%STATE%"
[server]
listen = "127.0.0.1:0"
[[sources]]
name = "shop"
database = "%DB%"
max_await = "200ms"
[[sources]]
name = "cluster"
max_await = "200ms"
` + sink("orders-hook", a.URL()) + sink("inserts-hook", b.URL()) + sink("customers-hook", c.URL()) + `
[[rules]]
name = "orders"
source = "shop"
namespaces = ["%DB%.orders"]
sinks = ["orders-hook"]
[[rules]]
name = "db-inserts"
source = "shop"
namespaces = ["%DB%.*"]
operations = ["insert"]
sinks = ["inserts-hook"]
[[rules]]
name = "orders-too"
source = "shop"
namespaces = ["%DB%.orders"]
operations = ["insert"]
sinks = ["inserts-hook"]
[[rules]]
name = "customers"
source = "cluster"
namespaces = ["%DB%.customers"]
sinks = ["customers-hook"]
`)
	e.start(cfg)
	ctx := context.Background()
	orders, customers := e.coll("orders"), e.coll("customers")
	for i := 0; i < 3; i++ {
		if _, err := orders.InsertOne(ctx, bson.D{{Key: "_id", Value: i}}); err != nil {
			t.Fatal(err)
		}
		if _, err := customers.InsertOne(ctx, bson.D{{Key: "_id", Value: 100 + i}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := orders.UpdateOne(ctx, bson.D{{Key: "_id", Value: 0}}, bson.D{{Key: "$set", Value: bson.D{{Key: "x", Value: 1}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := customers.DeleteOne(ctx, bson.D{{Key: "_id", Value: 100}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "every sink's changes", func() bool {
		return a.Count() >= 4 && b.Count() >= 6 && c.Count() >= 4
	})
	time.Sleep(300 * time.Millisecond) // nothing more may arrive

	type env struct {
		Source        string            `json:"source"`
		OperationType string            `json:"operationType"`
		NS            map[string]string `json:"ns"`
		Rules         []string          `json:"rules"`
	}
	decode := func(r *receiver.Receiver) []env {
		var out []env
		for _, d := range r.Deliveries() {
			var v env
			if err := json.Unmarshal(d.Envelope, &v); err != nil {
				t.Fatal(err)
			}
			out = append(out, v)
		}
		return out
	}
	summary := func(evs []env) string {
		var s []string
		for _, v := range evs {
			s = append(s, v.Source+":"+v.NS["coll"]+":"+v.OperationType+":"+strings.Join(v.Rules, "+"))
		}
		slices.Sort(s)
		return strings.Join(s, " ")
	}
	if got, want := summary(decode(a)), "shop:orders:insert:orders+db-inserts+orders-too shop:orders:insert:orders+db-inserts+orders-too shop:orders:insert:orders+db-inserts+orders-too shop:orders:update:orders"; got != want {
		t.Errorf("orders-hook got\n  %s\nwant\n  %s", got, want)
	}
	if got, want := summary(decode(b)), "shop:customers:insert:db-inserts shop:customers:insert:db-inserts shop:customers:insert:db-inserts shop:orders:insert:orders+db-inserts+orders-too shop:orders:insert:orders+db-inserts+orders-too shop:orders:insert:orders+db-inserts+orders-too"; got != want {
		t.Errorf("inserts-hook got\n  %s\nwant\n  %s", got, want)
	}
	if got, want := summary(decode(c)), "cluster:customers:delete:customers cluster:customers:insert:customers cluster:customers:insert:customers cluster:customers:insert:customers"; got != want {
		t.Errorf("customers-hook got\n  %s\nwant\n  %s", got, want)
	}
}
