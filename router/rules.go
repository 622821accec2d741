// Package router compiles routing rules into matchers and delivers each
// matched event to its sinks through per-sink lanes that keep per-document
// order, retry with backoff, park a lagging sink's backlog and dead-letter
// what cannot be delivered.
package router

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/query"
)

// RuleSpec is a routing rule as configured.
type RuleSpec struct {
	Name       string
	Source     string
	Operations []string // empty: every operation
	Namespaces []string // "db.coll" or "db.*"; empty: every namespace
	Filter     bson.D   // MongoDB query over the change event; nil: everything
	Sinks      []string
	// Shape is the payload shaping of the rule (nil: none); see
	// event.Shape. It applies after routing: the filter sees the raw
	// change.
	Shape *event.Shape
}

type rule struct {
	name   string
	source string
	idx    int // in Rules.rules
	ops    map[string]bool
	nsDB   map[string]bool // db.* patterns
	nsFull map[string]bool // db.coll patterns
	filter *query.Filter
	sinks  []int
	match  bson.D // the rule as a $match condition; nil when it matches everything
	local  bool   // the filter is evaluated in changegate only (not in match)

	// The Match of an event that matches this rule only, shared by those
	// events: read-only, and with len == cap so that appending copies.
	onlyRules []string
	onlySinks []int // sinks, sorted

	shape *event.Shape
	// sinkShapes is, per sink index of r.sinks, the shape of an event
	// routed to that sink by this rule alone: event.Stricter of the rule's
	// and the sink's shapes.
	sinkShapes map[int]*event.Shape
}

// Rules is the immutable, compiled routing table. It is safe for concurrent
// use.
type Rules struct {
	bySource map[string][]*rule
	rules    []*rule // every rule, in config order (rule.idx)
	// index holds the index of each source with many rules (index.go).
	index map[string]*sourceIndex

	// Shaping (shape.go); shaped is false when no rule or sink shapes
	// payloads, and Dispatch then takes its path without shapes.
	shaped     bool
	sinkNames  []string
	sinkShapes []*event.Shape // by sink index; nil entries: no shape
	combos     sync.Map       // comboKey -> *event.Shape, for events matched by several rules
}

// Match is the outcome of routing one event: the names of the rules that
// matched and the (deduplicated) indexes of the sinks to deliver to, as
// indexes into the sink list given to CompileRules.
type Match struct {
	Rules []string
	Sinks []int
}

// lifecycleOps always pass a pushed-down $match so the source sees stream
// lifecycle changes even when no rule routes them.
var lifecycleOps = bson.A{"invalidate", "drop", "rename", "dropDatabase"}

// CompileRules compiles specs against the given sink names. It returns an
// error for an unknown sink, an invalid namespace pattern or an invalid
// filter; config validation normally reports these first with file:line.
func CompileRules(specs []RuleSpec, sinkNames []string) (*Rules, error) {
	return CompileRulesShaped(specs, sinkNames, nil)
}

// CompileRulesShaped is CompileRules with the sinks' payload shapes
// (sinkShapes[i] is sinkNames[i]'s, nil for none; a nil slice: no sink
// shapes). An event routed to a sink is shaped with event.Stricter of the
// sink's shape and the shapes of every matching rule that routes to it.
func CompileRulesShaped(specs []RuleSpec, sinkNames []string, sinkShapes []*event.Shape) (*Rules, error) {
	idx := make(map[string]int, len(sinkNames))
	for i, n := range sinkNames {
		idx[n] = i
	}
	if sinkShapes != nil && len(sinkShapes) != len(sinkNames) {
		return nil, fmt.Errorf("compile rules: %d sink shapes for %d sinks", len(sinkShapes), len(sinkNames))
	}
	rs := &Rules{bySource: map[string][]*rule{}, sinkNames: slices.Clone(sinkNames), sinkShapes: make([]*event.Shape, len(sinkNames))}
	copy(rs.sinkShapes, sinkShapes)
	for _, s := range sinkShapes {
		rs.shaped = rs.shaped || s != nil
	}
	for _, sp := range specs {
		r := &rule{name: sp.Name, source: sp.Source, idx: len(rs.rules), shape: sp.Shape}
		rs.shaped = rs.shaped || sp.Shape != nil
		var conds bson.A
		if len(sp.Operations) > 0 {
			r.ops = map[string]bool{}
			ops := bson.A{}
			for _, op := range sp.Operations {
				r.ops[op] = true
				ops = append(ops, op)
			}
			conds = append(conds, bson.D{{Key: "operationType", Value: bson.D{{Key: "$in", Value: ops}}}})
		}
		if len(sp.Namespaces) > 0 {
			r.nsDB, r.nsFull = map[string]bool{}, map[string]bool{}
			var ors bson.A
			for _, ns := range sp.Namespaces {
				db, coll, ok := strings.Cut(ns, ".")
				if !ok || db == "" || coll == "" {
					return nil, fmt.Errorf("rule %q: namespace %q: want \"db.coll\" or \"db.*\"", sp.Name, ns)
				}
				if coll == "*" {
					r.nsDB[db] = true
					ors = append(ors, bson.D{{Key: "ns.db", Value: db}})
				} else {
					r.nsFull[ns] = true
					ors = append(ors, bson.D{{Key: "ns.db", Value: db}, {Key: "ns.coll", Value: coll}})
				}
			}
			conds = append(conds, bson.D{{Key: "$or", Value: ors}})
		}
		if len(sp.Filter) > 0 {
			raw, err := bson.Marshal(sp.Filter)
			if err != nil {
				return nil, fmt.Errorf("rule %q: filter: %w", sp.Name, err)
			}
			f, err := query.Compile(raw)
			if err != nil {
				return nil, fmt.Errorf("rule %q: filter: %w", sp.Name, err)
			}
			r.filter = f
			// A pattern PCRE could backtrack on stays in-process (see
			// query.BacktrackRisk): the pushed-down $match is then wider.
			if query.BacktrackRisk(raw) == "" {
				conds = append(conds, sp.Filter)
			} else {
				r.local = true
			}
		}
		switch len(conds) {
		case 0:
		case 1:
			r.match = conds[0].(bson.D)
		default:
			r.match = bson.D{{Key: "$and", Value: conds}}
		}
		seen := map[int]bool{}
		for _, s := range sp.Sinks {
			i, ok := idx[s]
			if !ok {
				return nil, fmt.Errorf("rule %q: unknown sink %q", sp.Name, s)
			}
			if !seen[i] {
				seen[i] = true
				r.sinks = append(r.sinks, i)
			}
		}
		r.sinkShapes = make(map[int]*event.Shape, len(r.sinks))
		for _, i := range r.sinks {
			r.sinkShapes[i] = event.Stricter(rs.sinkShapes[i], r.shape)
		}
		r.onlyRules = []string{r.name}
		r.onlySinks = slices.Clip(slices.Sorted(slices.Values(r.sinks)))
		rs.bySource[sp.Source] = append(rs.bySource[sp.Source], r)
		rs.rules = append(rs.rules, r)
	}
	for src, rules := range rs.bySource {
		if x := buildIndex(rules); x != nil {
			if rs.index == nil {
				rs.index = map[string]*sourceIndex{}
			}
			rs.index[src] = x
		}
	}
	return rs, nil
}

// Route returns the rules of e's source that match e and the sinks they send
// to. A nil Match.Sinks means nothing matched: the event is acknowledged at
// once. The returned slices may be shared with other events: they must not
// be modified.
func (rs *Rules) Route(e *event.Event) Match { return rs.route(e, nil) }

// route is Route, calling hit (when not nil) with the index of every
// matching rule. An event that matches one rule gets that rule's shared
// Match, without allocating.
func (rs *Rules) route(e *event.Event, hit func(idx int)) Match {
	var m Match
	var seen uint64 // bit set for the first 64 sinks; past that, duplicates are compacted at the end
	matched := 0
	copied := false // m.Sinks is no longer a rule's shared slice
	rules := rs.bySource[e.Source]
	var cand []int // with an index: the positions in rules that may match
	var buf [64]int
	if x := rs.index[e.Source]; x != nil {
		cand = x.candidates(e, buf[:0])
	}
	n := len(rules)
	if cand != nil {
		n = len(cand)
	}
	for i := 0; i < n; i++ {
		r := rules[i]
		if cand != nil {
			r = rules[cand[i]]
		}
		if !r.matches(e) {
			continue
		}
		if hit != nil {
			hit(r.idx)
		}
		matched++
		if matched == 1 {
			m.Rules, m.Sinks = r.onlyRules, r.onlySinks
			if len(r.sinks) == 0 {
				m.Sinks = nil
			}
		} else {
			if matched == 2 && cand != nil {
				// At most len(cand) rules match: one allocation each.
				m.Rules = append(make([]string, 0, len(cand)), m.Rules...)
				m.Sinks = append(make([]int, 0, len(cand)*len(r.sinks)), m.Sinks...)
			}
			m.Rules = append(m.Rules, r.name) // cap == len: copies the shared slice first
		}
		for _, s := range r.sinks {
			if s < 64 {
				if seen&(1<<uint(s)) != 0 {
					continue
				}
				seen |= 1 << uint(s)
			}
			if matched > 1 {
				m.Sinks = append(m.Sinks, s) // cap == len: copies the shared slice first
				copied = true
			}
		}
	}
	if copied && len(m.Sinks) > 1 {
		sort.Ints(m.Sinks)
		m.Sinks = slices.Compact(m.Sinks)
	}
	return m
}

func (r *rule) matches(e *event.Event) bool {
	if r.ops != nil && !r.ops[e.OperationType] {
		return false
	}
	if r.nsDB != nil && !r.nsDB[e.DB] && !r.nsFull[e.DB+"."+e.Coll] {
		return false
	}
	return r.filter == nil || r.filter.Match(e.Raw)
}

// Pushdown returns a $match stage equivalent to the union of the source's
// rules, to run inside MongoDB so unmatched changes never cross the network,
// and false when no such stage helps (a rule matches everything). A source
// without rules gets a stage that passes lifecycle events only. The stage always lets stream lifecycle events
// (invalidate, drop, rename, dropDatabase) through. The router still matches
// every event client-side.
func (rs *Rules) Pushdown(source string) (bson.D, bool) {
	rules := rs.bySource[source]
	ors := bson.A{bson.D{{Key: "operationType", Value: bson.D{{Key: "$in", Value: lifecycleOps}}}}}
	for _, r := range rules {
		if r.match == nil {
			return nil, false
		}
		ors = append(ors, r.match)
	}
	return bson.D{{Key: "$match", Value: bson.D{{Key: "$or", Value: ors}}}}, true
}

// RuleHit is one rule that matched an event, with the sinks it routes the
// event to (indexes into the sink list given to CompileRules, in the rule's
// order).
type RuleHit struct {
	Rule  string
	Sinks []int
	// FilterLocal: the rule's filter is evaluated in changegate only, not
	// pushed down into the change stream (query.BacktrackRisk); the
	// pushed-down $match then holds only its operations and namespaces.
	FilterLocal bool
}

// Explain routes e exactly as Route does (the same compiled rules and
// matchers) and also returns every matching rule with its sinks, in config
// order. It is for dry runs (changegate rules test, tail): the returned
// slices are the caller's.
func (rs *Rules) Explain(e *event.Event) (Match, []RuleHit) {
	var hits []RuleHit
	m := rs.route(e, func(idx int) {
		r := rs.rules[idx]
		hits = append(hits, RuleHit{Rule: r.name, Sinks: slices.Clone(r.sinks), FilterLocal: r.local})
	})
	return Match{Rules: slices.Clone(m.Rules), Sinks: slices.Clone(m.Sinks)}, hits
}
