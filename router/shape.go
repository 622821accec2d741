package router

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/event"
)

// Payload shaping (issue 17) happens after routing: rules match the raw
// change, then each sink an event is routed to gets the view of the event
// its shape makes (event.Event.Shaped; one view and one encoding per
// distinct shape, shared by the sinks that have it). The shape of a sink
// for an event is event.Stricter of the sink's shape and the shapes of the
// matching rules that route to that sink.

// shapeFor returns the shape of sink for an event matched by the rules
// whose indexes are ruleIdxs (in config order).
func (rs *Rules) shapeFor(ruleIdxs []int, sink int) *event.Shape {
	var only *rule
	n := 0
	for _, i := range ruleIdxs {
		if r := rs.rules[i]; r.routesTo(sink) {
			only = r
			n++
		}
	}
	switch n {
	case 0:
		return rs.sinkShapes[sink]
	case 1:
		return only.sinkShapes[sink]
	}
	var b strings.Builder
	b.WriteString(strconv.Itoa(sink))
	for _, i := range ruleIdxs {
		if rs.rules[i].routesTo(sink) {
			b.WriteByte(',')
			b.WriteString(strconv.Itoa(i))
		}
	}
	key := b.String()
	if s, ok := rs.combos.Load(key); ok {
		return s.(*event.Shape)
	}
	s := rs.sinkShapes[sink]
	for _, i := range ruleIdxs {
		if r := rs.rules[i]; r.routesTo(sink) {
			s = event.Stricter(s, r.shape)
		}
	}
	rs.combos.Store(key, s)
	return s
}

func (r *rule) routesTo(sink int) bool {
	_, ok := r.sinkShapes[sink]
	return ok
}

// sinkIndex returns the index of the named sink, or -1.
func (rs *Rules) sinkIndex(name string) int {
	for i, n := range rs.sinkNames {
		if n == name {
			return i
		}
	}
	return -1
}

// ShapeNamed returns the current shape of the named sink for an event
// routed by the named rules (names no longer configured, or of rules that
// do not route to the sink, are ignored; none left: the sink's own shape).
// It is for dry runs, which name the rules; a stored change is shaped with
// ReshapeStored, which routes it again. ok is false for an unknown sink.
func (rs *Rules) ShapeNamed(ruleNames []string, sink string) (s *event.Shape, ok bool) {
	si := rs.sinkIndex(sink)
	if si < 0 {
		return nil, false
	}
	var idxs []int
	for _, r := range rs.rules {
		for _, n := range ruleNames {
			if r.name == n {
				idxs = append(idxs, r.idx)
				break
			}
		}
	}
	return rs.shapeFor(idxs, si), true
}

// ReshapeStored shapes ev, rebuilt from a stored change (a dead letter
// being replayed, a parked entry being re-driven), for sink exactly as the
// current configuration shapes the same change arriving live: it routes ev
// through today's rules (the rule names stored with the entry do not
// count: a rule renamed or removed since must not loosen the shape) and
// applies the shape of the matching rules that route to sink; ev.Rules
// becomes today's matching rules. When no current rule routes ev to sink
// it returns an error wrapping deadletter.ErrNotRouted and nothing to
// deliver, unless unrouted is set (the operator's explicit choice): ev is
// then shaped with the strictest shape of the sink's current rules
// (event.Stricter of every rule that routes to sink, and of the sink's own
// shape). skip reports that the sink skips the shaped event
// (skip_empty_updates): there is nothing to deliver.
func (rs *Rules) ReshapeStored(ev *event.Event, sink string, unrouted bool) (view *event.Event, skip bool, err error) {
	si := rs.sinkIndex(sink)
	if si < 0 {
		return nil, false, fmt.Errorf("unknown sink %q", sink)
	}
	var idxs []int
	m := rs.route(ev, func(idx int) { idxs = append(idxs, idx) })
	routed := false
	for _, i := range idxs {
		routed = routed || rs.rules[i].routesTo(si)
	}
	if routed {
		ev.Rules = slices.Clone(m.Rules)
		view, skip = ev.Shaped(rs.shapeFor(idxs, si))
		return view, skip, nil
	}
	if !unrouted {
		return nil, false, fmt.Errorf("sink %s: %w", sink, deadletter.ErrNotRouted)
	}
	view, skip = ev.Shaped(rs.strictestShape(si))
	return view, skip, nil
}

// strictestShape is event.Stricter of the sink's own shape and the shape of
// every rule that routes to sink si, whatever its source.
func (rs *Rules) strictestShape(si int) *event.Shape {
	s := rs.sinkShapes[si]
	for _, r := range rs.rules {
		if r.routesTo(si) {
			s = event.Stricter(s, r.sinkShapes[si])
		}
	}
	return s
}

// Payload returns what sink receives for ev when the rule named rule
// routes it there: the shaped payload body (event.Event.Envelope of the
// shaped view; canonical selects canonical Extended JSON) and whether the
// sink skips the event (skip_empty_updates). It is the one entry point
// for showing a payload per (event, rule, sink), e.g. a rules test; the
// id is ev's.
func (rs *Rules) Payload(ev *event.Event, rule, sink string, canonical bool) (body []byte, skip bool, err error) {
	si := rs.sinkIndex(sink)
	if si < 0 {
		return nil, false, fmt.Errorf("unknown sink %q", sink)
	}
	var idxs []int
	for _, r := range rs.rules {
		if r.name == rule {
			idxs = append(idxs, r.idx)
		}
	}
	if len(idxs) == 0 {
		return nil, false, fmt.Errorf("unknown rule %q", rule)
	}
	if !rs.rules[idxs[0]].routesTo(si) {
		return nil, false, fmt.Errorf("rule %q does not route to sink %q", rule, sink)
	}
	v, skip := ev.Shaped(rs.shapeFor(idxs, si))
	if skip {
		return nil, true, nil
	}
	body, err = v.Envelope(canonical)
	return body, false, err
}

// reshaper returns the function that shapes an event rebuilt from a
// parked entry for the named sink with the engine's current rules
// (Rules.ReshapeStored, never for an unrouted change).
func (e *Engine) reshaper(sink string) func(*event.Event) (*event.Event, bool, error) {
	return func(ev *event.Event) (*event.Event, bool, error) {
		return e.state.Load().rules.ReshapeStored(ev, sink, false)
	}
}

// reshape shapes an event rebuilt from a parked entry for the lane's sink.
func (l *Lane) reshape(ev *event.Event) (*event.Event, bool, error) {
	if l.spec.reshape == nil {
		return ev, false, nil
	}
	return l.spec.reshape(ev)
}
