package app

import (
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/query"
	"github.com/changegate/changegate/router"
	"github.com/changegate/changegate/sinks"
)

// DryRun routes recorded change events as Run would, connecting to
// nothing (changegate rules test): with the same compiled rules
// (router.Rules, the matchers the router runs on every event, including
// the rules whose filter is also pushed down into the change stream), and
// with the envelope encoding the sinks use. It is safe for concurrent use.
type DryRun struct {
	cfg   *config.Config
	rules *router.Rules
	// push holds each source's pushed-down $match, compiled with the
	// router's matcher (package query); a source without one (a rule of
	// it matches everything) is absent.
	push map[string]*query.Filter
}

// NewDryRun compiles cfg's rules and each source's pushed-down $match.
func NewDryRun(cfg *config.Config) (*DryRun, error) {
	rules, err := CompileRules(cfg)
	if err != nil {
		return nil, err
	}
	d := &DryRun{cfg: cfg, rules: rules, push: map[string]*query.Filter{}}
	for _, sc := range cfg.Sources {
		stage, ok := rules.Pushdown(sc.Name)
		if !ok {
			continue
		}
		raw, err := bson.Marshal(stage[0].Value)
		if err != nil {
			return nil, fmt.Errorf("source %s: pushed-down $match: %w", sc.Name, err)
		}
		f, err := query.Compile(raw)
		if err != nil {
			return nil, fmt.Errorf("source %s: pushed-down $match: %w", sc.Name, err)
		}
		d.push[sc.Name] = f
	}
	return d, nil
}

// Pushdown verdicts of a Routed event.
const (
	// PushdownNone: the source has no pushed-down $match (one of its
	// rules matches every change), so MongoDB sends every change.
	PushdownNone = "none"
	// PushdownPass: the source's pushed-down $match lets the change out
	// of MongoDB.
	PushdownPass = "pass"
	// PushdownDrop: the source's pushed-down $match filters the change
	// out inside MongoDB; changegate never reads it.
	PushdownDrop = "drop"
)

// Routed is what one source would do with one recorded change.
type Routed struct {
	// Event is the change as the source builds it (id, namespace, ...),
	// with Rules set as the router sets them.
	Event *event.Event
	// Pushdown is PushdownNone, PushdownPass or PushdownDrop.
	Pushdown string
	// Rules are the matching rules, in config order, with their sinks.
	Rules []RuleHit
	// Deliveries are the sinks the event goes to, in config order (one
	// delivery per sink, however many rules route it there).
	Deliveries []Delivery
}

// RuleHit is a rule that matched, and the names of its sinks.
type RuleHit struct {
	Rule  string
	Sinks []string
	// FilterLocal: the rule's filter is evaluated in changegate only, not
	// pushed down (a regular expression PCRE could backtrack on).
	FilterLocal bool
}

// Delivery is one sink that would receive the event.
type Delivery struct {
	Sink *config.Sink
	// Rules are the matching rules that route the event to this sink.
	Rules []string
	// Envelope is the payload the sink is given (see SinkEnvelope); nil
	// when Err is set.
	Envelope []byte
	// Err: the envelope cannot be encoded, so the sink dead-letters the
	// event (reason "encode") instead of sending it.
	Err error
	// Skipped: an update whose shaped changes are empty, which the sink
	// (skip_empty_updates) does not send; it is acknowledged all the same.
	Skipped bool
}

// Sources returns the names of the sources whose change stream carries the
// changes of namespace db.coll, in config order: a cluster source, a
// database source of db, a collection source of db.coll. A change without
// a namespace (invalidate) may come from any source; a database-level
// change (coll empty: dropDatabase) from any source of db. No source
// carries the changes of the state database (mongo.state_database).
func (d *DryRun) Sources(db, coll string) []string {
	if db != "" && db == d.cfg.Mongo.StateDatabase {
		return nil
	}
	var out []string
	for _, sc := range d.cfg.Sources {
		switch {
		case db == "", sc.Database == "":
		case sc.Database != db:
			continue
		case sc.Collection == "", coll == "", sc.Collection == coll:
		default:
			continue
		}
		out = append(out, sc.Name)
	}
	return out
}

// Route routes raw, a change event as source reads it (after the source's
// pipeline stages, as changegate tail prints it), through the router's
// compiled rules. seq is the event's position, for its Seq only. It
// returns an error for an unknown source or a document that is not a
// change event (no resume token _id), as the source would refuse it.
func (d *DryRun) Route(source string, seq uint64, raw bson.Raw) (*Routed, error) {
	if d.cfg.Source(source) == nil {
		return nil, fmt.Errorf("no source %q", source)
	}
	ev, err := event.FromChange(source, seq, raw)
	if err != nil {
		return nil, err
	}
	out := &Routed{Event: ev, Pushdown: PushdownNone}
	if f := d.push[source]; f != nil {
		out.Pushdown = PushdownDrop
		if f.Match(raw) {
			out.Pushdown = PushdownPass
		}
	}
	m, hits := d.rules.Explain(ev)
	if len(m.Sinks) == 0 {
		return out, nil
	}
	ev.Rules = m.Rules // as router.Engine.Dispatch does, before any sink encodes
	via := map[int][]string{}
	for _, h := range hits {
		names := make([]string, len(h.Sinks))
		for i, s := range h.Sinks {
			names[i] = d.cfg.Sinks[s].Name
			via[s] = append(via[s], h.Rule)
		}
		out.Rules = append(out.Rules, RuleHit{Rule: h.Rule, Sinks: names, FilterLocal: h.FilterLocal})
	}
	for _, s := range m.Sinks {
		sc := &d.cfg.Sinks[s]
		// Shaped as router.Engine.Dispatch does: the stricter of the
		// sink's shape and its matching rules'.
		shape, _ := d.rules.ShapeNamed(via[s], sc.Name)
		v, skip := ev.Shaped(shape)
		if skip {
			out.Deliveries = append(out.Deliveries, Delivery{Sink: sc, Rules: via[s], Skipped: true})
			continue
		}
		env, err := SinkEnvelope(v, sc, via[s])
		out.Deliveries = append(out.Deliveries, Delivery{Sink: sc, Rules: via[s], Envelope: env, Err: err})
	}
	return out, nil
}

// SinkEnvelope returns the payload sink sc is given for e — the event as
// shaped for the sink (event.Event.Shaped; Route shapes it) — routed to it
// by rules: the bytes of sinks.EncodeEnvelope in the sink's json format,
// which the webhook sink posts as the body, the lambda sink sends as the
// Invoke payload, the SQS and SNS sinks send as the message body and the
// Kafka sink as the record value; or of sinks.EncodeRecord (the same but
// for envelope = "document", whose metadata then goes beside fullDocument)
// for the EventBridge detail, the Kinesis record and the elements of a
// batching webhook's or lambda's JSON array. An error
// means the sink fails the event permanently (reason "encode") and
// dead-letters it. It is the one place dry runs take a sink's payload
// from.
func SinkEnvelope(e *event.Event, sc *config.Sink, rules []string) ([]byte, error) {
	canonical := sc.JSON == config.JSONCanonical
	attributes := sc.SQS != nil || sc.SNS != nil // the metadata goes in message attributes
	if sc.EventBridge != nil || sc.Kinesis != nil || (!attributes && sc.Kafka == nil && sc.BatchSize > 1) {
		return sinks.EncodeRecord(e, canonical)
	}
	return sinks.EncodeEnvelope(e, canonical)
}
