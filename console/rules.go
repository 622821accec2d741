package console

import (
	"fmt"
	"net/http"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/query"
	"github.com/changegate/changegate/router"
	"github.com/changegate/changegate/source"
)

type consoleRules struct {
	PushdownOff bool
	Sources     []consoleRuleSource
}

type consoleRuleSource struct {
	Name string
	// Stage is the $match stage the source's change stream runs with
	// (relaxed Extended JSON), empty when none.
	Stage string
	// StateDB is changegate's state database and StateStage the $match
	// stage that leaves it out (source.StateFilter), first in the
	// pipeline of a whole-cluster source; empty for the others.
	StateDB, StateStage string
	Rules               []consoleRule
}

type consoleRule struct {
	Name, Operations, Namespaces, Filter, Sinks string
	// Pushed is the rule's condition inside the source's $match stage,
	// empty when nothing of it is pushed down; Why says what is not.
	Pushed, Why string
	Matches     float64
}

// buildRules describes cfg's rules: per source, the stage pushed down and
// each rule's share of it, and the matches counted so far (by "source\x00rule").
func buildRules(cfg *config.Config, stages map[string]bson.D, noPushdown bool, matches map[string]float64) *consoleRules {
	out := &consoleRules{PushdownOff: noPushdown}
	names := make([]string, len(cfg.Sinks))
	for i, s := range cfg.Sinks {
		names[i] = s.Name
	}
	for _, sc := range cfg.Sources {
		rs := consoleRuleSource{Name: sc.Name}
		if st := stages[sc.Name]; st != nil {
			rs.Stage = extJSON(st)
		}
		if sc.Database == "" && cfg.Mongo.StateDatabase != "" {
			// As source.Source.open builds the pipeline.
			rs.StateDB, rs.StateStage = cfg.Mongo.StateDatabase, extJSON(source.StateFilter(cfg.Mongo.StateDatabase))
		}
		for _, r := range cfg.Rules {
			if r.Source != sc.Name {
				continue
			}
			cr := consoleRule{
				Name: r.Name, Operations: strings.Join(r.Operations, ", "), Sinks: strings.Join(r.Sinks, ", "),
				Matches: matches[r.Source+"\x00"+r.Name],
			}
			var ns []string
			for _, n := range r.Namespaces {
				ns = append(ns, n.String())
			}
			cr.Namespaces = strings.Join(ns, ", ")
			if len(r.Filter) > 0 {
				cr.Filter = extJSON(r.Filter)
			}
			switch pushed, ok := rulePushdown(r, names); {
			case noPushdown:
				cr.Why = "pushdown disabled (-no-pushdown)"
			case !ok:
				cr.Why = "matches every change (as pushed down): the source's stream is not filtered"
			default:
				cr.Pushed = pushed
			}
			if why := backtrackRisk(r); why != "" && !noPushdown {
				cr.Why = strings.TrimSpace(cr.Why + " the filter is evaluated in changegate only: " + why)
			}
			rs.Rules = append(rs.Rules, cr)
		}
		out.Sources = append(out.Sources, rs)
	}
	return out
}

// backtrackRisk is why r's filter is not pushed down (PushdownNotes), or "".
func backtrackRisk(r config.Rule) string {
	if len(r.Filter) == 0 {
		return ""
	}
	raw, err := bson.Marshal(r.Filter)
	if err != nil {
		return ""
	}
	return query.BacktrackRisk(raw)
}

// rulePushdown returns the condition rule r contributes to its source's
// $match stage: the rule compiled alone, its Pushdown's $or without the
// lifecycle clause every stage carries.
func rulePushdown(r config.Rule, sinkNames []string) (string, bool) {
	rules, err := router.CompileRules([]router.RuleSpec{ruleSpec(r)}, sinkNames)
	if err != nil {
		return "", false
	}
	stage, ok := rules.Pushdown(r.Source)
	if !ok || len(stage) != 1 {
		return "", false
	}
	m, _ := stage[0].Value.(bson.D)
	if len(m) != 1 {
		return "", false
	}
	ors, _ := m[0].Value.(bson.A)
	if len(ors) != 2 {
		return "", false
	}
	return extJSON(ors[1]), true
}

// ruleSpec is r as the router compiles it, without its shape (which does
// not change what is pushed down).
func ruleSpec(r config.Rule) router.RuleSpec {
	var ns []string
	for _, n := range r.Namespaces {
		ns = append(ns, n.String())
	}
	return router.RuleSpec{Name: r.Name, Source: r.Source, Operations: r.Operations, Namespaces: ns, Filter: r.Filter, Sinks: r.Sinks}
}

func extJSON(v any) string {
	b, err := bson.MarshalExtJSON(v, false, false)
	if err != nil {
		// A bare value (not a document): wrap it to print it.
		if b, err = bson.MarshalExtJSON(bson.D{{Key: "v", Value: v}}, false, false); err != nil {
			return fmt.Sprint(v)
		}
	}
	return string(b)
}

func (c *Console) consoleRules(_ *http.Request, p *consolePage) int {
	matches := map[string]float64{}
	collect(c.metrics.EventsMatched, func(l map[string]string, v float64) {
		matches[l["source"]+"\x00"+l["rule"]] += v
	})
	stages, off := c.gw.Pushdowns()
	p.Rules = buildRules(c.gw.Config(), stages, off, matches)
	return http.StatusOK
}
