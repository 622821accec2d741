package deliverylog

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/changegate/changegate/config"
)

// Windows are the windows Analytics accepts, by name.
var Windows = map[string]time.Duration{"1h": time.Hour, "6h": 6 * time.Hour, "24h": 24 * time.Hour, "7d": 7 * 24 * time.Hour}

// Analytics are the records of a window, per sink and per rule.
type Analytics struct {
	Window string    `json:"window"`
	Since  time.Time `json:"since"`
	Until  time.Time `json:"until"`
	Sinks  []Group   `json:"sinks"`
	Rules  []Group   `json:"rules"`
	// Covers says what the figures include and what they cannot.
	Covers []string `json:"covers"`
}

// Group are the figures of one sink or rule.
type Group struct {
	Name string `json:"name"`
	// Attempts counts records: requests (a batch once).
	Attempts int64 `json:"attempts"`
	// Events counts the events of those requests.
	Events int64 `json:"events"`
	// ByOutcome, ByOperation and ByCollection count events; an operation
	// or collection a batch's events do not share is "(mixed)".
	ByOutcome    map[Outcome]int64 `json:"by_outcome"`
	ByOperation  map[string]int64  `json:"by_operation"`
	ByCollection map[string]int64  `json:"by_collection"`
	// Latency is the attempts' duration.
	Latency Latency `json:"latency"`
}

// Latency are percentiles of attempt durations, in milliseconds: the upper
// bounds of the buckets they fall in (buckets 19% wide).
type Latency struct {
	Count int64   `json:"count"`
	P50   float64 `json:"p50_ms"`
	P95   float64 `json:"p95_ms"`
	P99   float64 `json:"p99_ms"`
}

const mixed = "(mixed)"

// Analytics returns the figures of the window named window (Windows),
// ending now, from the log: counts by outcome, operation and collection
// and latency percentiles, per sink and per rule (a request routed by
// several rules counts for each). dropped is how many records this
// process dropped, for the covers (negative: unknown).
func (l *Log) Analytics(ctx context.Context, window string, dropped int64) (Analytics, error) {
	d, ok := Windows[window]
	if !ok {
		return Analytics{}, fmt.Errorf("%w: window %q: use one of 1h, 6h, 24h, 7d", ErrBadFilter, window)
	}
	until := time.Now().UTC().Truncate(time.Millisecond)
	a := Analytics{Window: window, Since: until.Add(-d), Until: until, Sinks: []Group{}, Rules: []Group{}}
	match := bson.D{{Key: "$match", Value: bson.D{{Key: "at", Value: bson.D{{Key: "$gte", Value: a.Since}, {Key: "$lt", Value: a.Until}}}}}}

	type countRow struct {
		ID struct {
			Sink      string   `bson:"sink"`
			Rules     []string `bson:"rules"`
			Outcome   Outcome  `bson:"outcome"`
			Operation string   `bson:"op"`
			DB        string   `bson:"db"`
			Coll      string   `bson:"coll"`
		} `bson:"_id"`
		Attempts int64 `bson:"attempts"`
		Events   int64 `bson:"events"`
	}
	var counts []countRow
	if err := l.aggregate(ctx, mongo.Pipeline{match, {{Key: "$group", Value: bson.D{
		{Key: "_id", Value: bson.D{{Key: "sink", Value: "$sink"}, {Key: "rules", Value: "$rules"}, {Key: "outcome", Value: "$outcome"},
			{Key: "op", Value: "$op"}, {Key: "db", Value: "$db"}, {Key: "coll", Value: "$coll"}}},
		{Key: "attempts", Value: bson.D{{Key: "$sum", Value: 1}}},
		{Key: "events", Value: bson.D{{Key: "$sum", Value: "$events"}}},
	}}}}, &counts); err != nil {
		return Analytics{}, err
	}
	type latencyRow struct {
		ID struct {
			Sink   string   `bson:"sink"`
			Rules  []string `bson:"rules"`
			Bucket int      `bson:"b"`
		} `bson:"_id"`
		Attempts int64 `bson:"attempts"`
	}
	var lat []latencyRow
	if err := l.aggregate(ctx, mongo.Pipeline{match, {{Key: "$group", Value: bson.D{
		{Key: "_id", Value: bson.D{{Key: "sink", Value: "$sink"}, {Key: "rules", Value: "$rules"}, {Key: "b", Value: "$lat_bucket"}}},
		{Key: "attempts", Value: bson.D{{Key: "$sum", Value: 1}}},
	}}}}, &lat); err != nil {
		return Analytics{}, err
	}

	sinks, rules := map[string]*Group{}, map[string]*Group{}
	groupOf := func(m map[string]*Group, name string) *Group {
		g := m[name]
		if g == nil {
			g = &Group{Name: name, ByOutcome: map[Outcome]int64{}, ByOperation: map[string]int64{}, ByCollection: map[string]int64{}}
			m[name] = g
		}
		return g
	}
	for _, c := range counts {
		op, coll := c.ID.Operation, c.ID.DB+"."+c.ID.Coll
		if op == "" {
			op = mixed
		}
		if c.ID.DB == "" {
			coll = mixed
		}
		targets := []*Group{groupOf(sinks, c.ID.Sink)}
		for _, r := range c.ID.Rules {
			targets = append(targets, groupOf(rules, r))
		}
		for _, g := range targets {
			g.Attempts += c.Attempts
			g.Events += c.Events
			g.ByOutcome[c.ID.Outcome] += c.Events
			g.ByOperation[op] += c.Events
			g.ByCollection[coll] += c.Events
		}
	}
	sinkHist, ruleHist := map[string]map[int]int64{}, map[string]map[int]int64{}
	add := func(h map[string]map[int]int64, name string, b int, n int64) {
		if h[name] == nil {
			h[name] = map[int]int64{}
		}
		h[name][b] += n
	}
	for _, r := range lat {
		add(sinkHist, r.ID.Sink, r.ID.Bucket, r.Attempts)
		for _, rule := range r.ID.Rules {
			add(ruleHist, rule, r.ID.Bucket, r.Attempts)
		}
	}
	for name, h := range sinkHist {
		groupOf(sinks, name).Latency = percentiles(h)
	}
	for name, h := range ruleHist {
		groupOf(rules, name).Latency = percentiles(h)
	}
	for _, g := range sinks {
		a.Sinks = append(a.Sinks, *g)
	}
	for _, g := range rules {
		a.Rules = append(a.Rules, *g)
	}
	byName := func(x, y Group) int {
		if x.Name < y.Name {
			return -1
		}
		if x.Name > y.Name {
			return 1
		}
		return 0
	}
	slices.SortFunc(a.Sinks, byName)
	slices.SortFunc(a.Rules, byName)
	a.Covers = l.analyticsCovers(d, dropped)
	return a, nil
}

func (l *Log) aggregate(ctx context.Context, p mongo.Pipeline, out any) error {
	cur, err := l.coll.Aggregate(ctx, p)
	if err != nil {
		return fmt.Errorf("delivery log: analytics: %w", err)
	}
	if err := cur.All(ctx, out); err != nil {
		return fmt.Errorf("delivery log: analytics: %w", err)
	}
	return nil
}

// percentiles reads p50, p95 and p99 from a histogram of latency buckets.
func percentiles(h map[int]int64) Latency {
	buckets := make([]int, 0, len(h))
	var total int64
	for b, n := range h {
		buckets = append(buckets, b)
		total += n
	}
	slices.Sort(buckets)
	l := Latency{Count: total}
	at := func(p float64) float64 {
		rank := int64(math.Ceil(p * float64(total)))
		var cum int64
		for _, b := range buckets {
			cum += h[b]
			if cum >= rank {
				return math.Round(bucketBound(b)*1000) / 1000
			}
		}
		return 0
	}
	if total > 0 {
		l.P50, l.P95, l.P99 = at(0.50), at(0.95), at(0.99)
	}
	return l
}

func (l *Log) analyticsCovers(window time.Duration, dropped int64) []string {
	var c []string
	if l.retention > 0 && window > l.retention {
		c = append(c, fmt.Sprintf("the log keeps records for %s: this window covers only its last %s", l.retention, l.retention))
	}
	switch l.mode {
	case config.DeliveryLogAll:
		c = append(c, `mode "all": every attempt recorded is counted`)
	default:
		c = append(c, `mode "failures": successful attempts are not recorded, so delivered counts and the latency of successes are not included; latency covers the failed attempts`)
	}
	c = append(c, "attempts count requests (a batch once), the other counts events; a request routed by several rules counts for each")
	c = append(c, "latency percentiles are the upper bounds of buckets 19% wide")
	if dropped > 0 {
		c = append(c, fmt.Sprintf("this replica dropped %d records since it started (MongoDB did not keep up or a write failed): the counts are short by at least that", dropped))
	}
	return c
}
