package mongowire

// $expr in query filters (find, update, delete, findAndModify, aggregate
// and change-stream $match). Package query, which the product shares,
// knows no aggregation expressions, so a filter that uses $expr is split
// here: $expr clauses are evaluated with evalExpression, $and/$or/$nor are
// combined here, and everything else is compiled by query.Compile as
// before. A filter without $expr goes to query.Compile unchanged.
//
// Per the manual (reference/operator/query/expr), $expr may appear at the
// top level of a filter and inside $and/$or/$nor, not under a field or in
// $elemMatch; its result is coerced to a boolean like $cond's condition.

import (
	"bytes"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// filterErr is the command error for a filter that does not compile: an
// expression's own error (code and message) or BadValue.
func filterErr(err error) *CommandError {
	if ce, ok := err.(*CommandError); ok {
		return ce
	}
	return cmdErr(codeBadValue, "%v", err)
}

type exprMatcher struct {
	expr bson.RawValue
	now  time.Time
}

// Match evaluates the expression; an evaluation error does not match (the
// server would fail the command; mongowire validates expressions when the
// filter is compiled, see checkExpr).
func (m exprMatcher) Match(doc bson.Raw) bool {
	v, err := evalExpression(&exprEnv{root: doc, now: m.now}, m.expr)
	return err == nil && truthy(v)
}

type andMatchers []matcher

func (a andMatchers) Match(doc bson.Raw) bool {
	for _, m := range a {
		if !m.Match(doc) {
			return false
		}
	}
	return true
}

type orMatchers []matcher

func (o orMatchers) Match(doc bson.Raw) bool {
	for _, m := range o {
		if m.Match(doc) {
			return true
		}
	}
	return false
}

type norMatchers []matcher

func (o norMatchers) Match(doc bson.Raw) bool { return !orMatchers(o).Match(doc) }

// usesExpr reports whether a filter has $expr at the top level or inside
// $and/$or/$nor.
func usesExpr(filter bson.Raw) bool {
	if !bytes.Contains(filter, []byte("$expr\x00")) {
		return false
	}
	elems, _ := filter.Elements()
	for _, e := range elems {
		switch e.Key() {
		case "$expr":
			return true
		case "$and", "$or", "$nor":
			vals, _ := bson.Raw(e.Value().Value).Values()
			for _, v := range vals {
				if d, ok := v.DocumentOK(); ok && usesExpr(d) {
					return true
				}
			}
		}
	}
	return false
}

// compileExprFilter compiles a filter that uses $expr; now is $$NOW.
func compileExprFilter(filter bson.Raw, now time.Time) (matcher, error) {
	elems, err := filter.Elements()
	if err != nil {
		return nil, cmdErr(codeBadValue, "%v", err)
	}
	var (
		ms   andMatchers
		rest = bsoncore.NewDocumentBuilder()
		n    int
	)
	for _, e := range elems {
		switch k := e.Key(); {
		case k == "$expr":
			if err := checkExpr(e.Value(), now); err != nil {
				return nil, err
			}
			ms = append(ms, exprMatcher{expr: e.Value(), now: now})
		case (k == "$and" || k == "$or" || k == "$nor") && e.Value().Type == bson.TypeArray:
			vals, _ := bson.Raw(e.Value().Value).Values()
			if len(vals) == 0 {
				return nil, cmdErr(codeBadValue, "%s argument must be a non-empty array", k)
			}
			subs := make([]matcher, 0, len(vals))
			for _, v := range vals {
				d, ok := v.DocumentOK()
				if !ok {
					return nil, cmdErr(codeBadValue, "%s argument's entries must be objects", k)
				}
				m, err := compileFilterAt(d, now)
				if err != nil {
					return nil, err
				}
				subs = append(subs, m)
			}
			switch k {
			case "$and":
				ms = append(ms, andMatchers(subs))
			case "$or":
				ms = append(ms, orMatchers(subs))
			default:
				ms = append(ms, norMatchers(subs))
			}
		default:
			rest.AppendValue(k, bsoncore.Value{Type: bsoncore.Type(e.Value().Type), Data: e.Value().Value})
			n++
		}
	}
	if n > 0 {
		m, err := compileFilter(bson.Raw(rest.Build()))
		if err != nil {
			return nil, err
		}
		ms = append(ms, m)
	}
	return ms, nil
}

// checkExpr reports the errors an expression has regardless of the
// document (unknown operators, wrong arity) by evaluating it once against
// an empty document, as the server rejects them when it parses the
// command.
func checkExpr(e bson.RawValue, now time.Time) error {
	_, err := evalExpression(&exprEnv{root: bson.Raw(emptyDoc), now: now}, e)
	if ce, ok := err.(*CommandError); ok {
		switch ce.Code {
		case codeInvalidPipelineOperator, 15983, 16020, 16404, 17276, 16872, 17080, 17081, 17082, 17083, 1257300:
			return ce
		}
	}
	return nil
}

var emptyDoc = []byte{5, 0, 0, 0, 0}

// withoutExpr returns filter without its $expr clauses (top level and in
// $and/$or/$nor), for computing an upsert's seed: $expr contributes no
// equality field.
func withoutExpr(filter bson.Raw) bson.Raw {
	if !usesExpr(filter) {
		return filter
	}
	elems, _ := filter.Elements()
	b := bsoncore.NewDocumentBuilder()
	for _, e := range elems {
		switch e.Key() {
		case "$expr":
			continue
		case "$and", "$or", "$nor":
			vals, _ := bson.Raw(e.Value().Value).Values()
			ab := bsoncore.NewArrayBuilder()
			for _, v := range vals {
				if d, ok := v.DocumentOK(); ok {
					ab.AppendDocument(withoutExpr(d))
				} else {
					ab.AppendValue(bsoncore.Value{Type: bsoncore.Type(v.Type), Data: v.Value})
				}
			}
			b.AppendArray(e.Key(), ab.Build())
			continue
		}
		b.AppendValue(e.Key(), bsoncore.Value{Type: bsoncore.Type(e.Value().Type), Data: e.Value().Value})
	}
	return bson.Raw(b.Build())
}
