package deliverylog

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/changegate/changegate/test/mongotest"
)

// TestQueriesAtScale measures each query of GET /api/v1/deliveries (and the
// event-id lookup of the lifecycle) on a log of CHANGEGATE_TEST_DELIVERYLOG_RECORDS
// records (issue 41: a million), spread over 72 hours, 10 sinks, 20 rules,
// 3 sources, ~3 records per document key, outcomes mixed as a failing
// deployment's are (60% failed, 20% retrying, 5% dead-lettered, 5% parked,
// 10% delivered). Opt-in: it writes that many records first.
//
//	CHANGEGATE_TEST_MONGODB_URI=mongodb://... CHANGEGATE_TEST_DELIVERYLOG_RECORDS=1000000 \
//	  go test -run TestQueriesAtScale -v -timeout 30m ./deliverylog/
//
// Against a real MongoDB each query must answer its first and second page
// within 50 ms (median of 5) and use an index (no COLLSCAN in its winning
// plan); against test/mongowire, which has no query planner and scans, it
// only reports the times.
func TestQueriesAtScale(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("CHANGEGATE_TEST_DELIVERYLOG_RECORDS"))
	if n <= 0 {
		t.Skip("opt-in: CHANGEGATE_TEST_DELIVERYLOG_RECORDS=1000000 (with CHANGEGATE_TEST_MONGODB_URI for a real MongoDB)")
	}
	real := os.Getenv("CHANGEGATE_TEST_MONGODB_URI") != ""
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	db := mongotest.Database(t, "cgtest_deliverylog_scale_")
	l := NewLog(db.Collection("deliveries"), 72*time.Hour, "all", Deps{})
	if err := l.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}

	rng := rand.New(rand.NewPCG(42, 41))
	now := time.Now().UTC()
	outcomes := []struct {
		o   Outcome
		pct int
	}{{OutcomeFailed, 60}, {OutcomeRetrying, 20}, {OutcomeDeadLettered, 5}, {OutcomeParked, 5}, {OutcomeDelivered, 10}}
	pick := func() Outcome {
		x := rng.IntN(100)
		for _, o := range outcomes {
			if x < o.pct {
				return o.o
			}
			x -= o.pct
		}
		return OutcomeDelivered
	}
	keys := max(n/3, 1)
	var someID string
	someKey := bson.Raw(nil)
	start := time.Now()
	const batch = 10000
	docs := make([]any, 0, batch)
	for i := range n {
		key, _ := bson.Marshal(bson.D{{Key: "_id", Value: rng.IntN(keys)}})
		id := fmt.Sprintf("src%d:%016x", i%3, rng.Uint64())
		dur := rng.ExpFloat64() * 50 // ms: most fast, a long tail
		s := stored{
			ID: bson.NewObjectID(), At: now.Add(-time.Duration(rng.Int64N(int64(72 * time.Hour)))), EventIDs: []string{id}, Events: 1,
			Source: fmt.Sprintf("src%d", i%3), DB: "shop", Coll: "orders", Operation: "update", Keys: []bson.Raw{key},
			Sink: fmt.Sprintf("sink%d", rng.IntN(10)), Rules: []string{fmt.Sprintf("rule%d", rng.IntN(20))},
			Attempt: 1 + int(rng.ExpFloat64()), Outcome: pick(), Status: 503, ErrorClass: "http_5xx",
			DurationMS: dur, LatBucket: latencyBucket(dur), Replica: "r1",
		}
		if i == n/2 {
			someID, someKey = id, key
		}
		docs = append(docs, s)
		if len(docs) == batch || i == n-1 {
			if _, err := l.coll.InsertMany(ctx, docs, options.InsertMany().SetOrdered(false)); err != nil {
				t.Fatal(err)
			}
			docs = docs[:0]
		}
	}
	t.Logf("%d records written in %v", n, time.Since(start).Round(time.Millisecond))

	keyJSON, _ := bson.MarshalExtJSON(someKey, false, false)
	queries := []struct {
		name string
		q    Query
	}{
		{"newest", Query{}},
		{"sink", Query{Sink: "sink3"}},
		{"rule", Query{Rule: "rule7"}},
		{"source", Query{Source: "src1"}},
		{"status=failed", Query{Status: "failed"}},
		{"status=dead_lettered", Query{Status: "dead_lettered"}},
		{"sink+status=dead_lettered", Query{Sink: "sink3", Status: "dead_lettered"}},
		{"since=1h", Query{Since: "1h"}},
		{"sink+since+until", Query{Sink: "sink3", Since: "30h", Until: "20h"}},
		{"document_key", Query{DocumentKey: string(keyJSON)}},
		{"min_attempts=5", Query{MinAttempts: "5"}},
		{"min_duration=300ms", Query{MinDuration: "300ms"}},
		{"sink+min_duration=300ms", Query{Sink: "sink3", MinDuration: "300ms"}},
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n| query | first page | second page | records | plan |\n|---|--:|--:|--:|---|\n")
	median := func(f func()) time.Duration {
		var ds []time.Duration
		for range 5 {
			s := time.Now()
			f()
			ds = append(ds, time.Since(s))
		}
		slices.Sort(ds)
		return ds[2]
	}
	for _, qc := range queries {
		f, err := qc.q.Filter(now)
		if err != nil {
			t.Fatal(err)
		}
		var p Page
		first := median(func() {
			if p, err = l.List(ctx, f); err != nil {
				t.Fatal(err)
			}
		})
		second := time.Duration(0)
		if p.Next != "" {
			g := f
			g.Cursor = p.Next
			second = median(func() {
				if _, err := l.List(ctx, g); err != nil {
					t.Fatal(err)
				}
			})
		}
		plan := "—"
		if real {
			plan = winningPlan(ctx, t, l, f)
			if strings.Contains(plan, "COLLSCAN") {
				t.Errorf("%s: the winning plan scans the collection: %s", qc.name, plan)
			}
			if first > 50*time.Millisecond || second > 50*time.Millisecond {
				t.Errorf("%s: %v, %v: want each page within 50 ms", qc.name, first, second)
			}
		}
		fmt.Fprintf(&b, "| %s | %.1f ms | %.1f ms | %d | %s |\n", qc.name, ms(first), ms(second), len(p.Records), plan)
	}
	var got []stored
	byID := median(func() {
		cur, err := l.coll.Find(ctx, bson.D{{Key: "event_ids", Value: someID}}, options.Find().SetSort(bson.D{{Key: "at", Value: 1}}).SetLimit(maxLifecycleRecords))
		if err != nil {
			t.Fatal(err)
		}
		if err := cur.All(ctx, &got); err != nil {
			t.Fatal(err)
		}
	})
	if len(got) != 1 {
		t.Fatalf("event id lookup: %d records, want 1", len(got))
	}
	fmt.Fprintf(&b, "| event id (lifecycle) | %.1f ms | | 1 | |\n", ms(byID))
	t.Log(b.String())
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// winningPlan returns the stages of the winning plan of f's first page, as
// explain reports them (e.g. "LIMIT<FETCH<IXSCAN sink_at").
func winningPlan(ctx context.Context, t *testing.T, l *Log, f Filter) string {
	t.Helper()
	q, err := f.query()
	if err != nil {
		t.Fatal(err)
	}
	var out bson.Raw
	err = l.coll.Database().RunCommand(ctx, bson.D{
		{Key: "explain", Value: bson.D{{Key: "find", Value: l.coll.Name()}, {Key: "filter", Value: q},
			{Key: "sort", Value: bson.D{{Key: "at", Value: -1}, {Key: "_id", Value: -1}}}, {Key: "limit", Value: DefaultLimit + 1}}},
		{Key: "verbosity", Value: "queryPlanner"},
	}).Decode(&out)
	if err != nil {
		t.Fatal(err)
	}
	wp, err := out.LookupErr("queryPlanner", "winningPlan")
	if err != nil {
		return "?"
	}
	var stages []string
	doc, _ := wp.DocumentOK()
	for doc != nil {
		st, _ := doc.Lookup("stage").StringValueOK()
		if ix, ok := doc.Lookup("indexName").StringValueOK(); ok {
			st += " " + ix
		}
		stages = append(stages, st)
		next, err := doc.LookupErr("inputStage")
		if err != nil {
			break
		}
		doc, _ = next.DocumentOK()
	}
	return strings.Join(stages, "<")
}
