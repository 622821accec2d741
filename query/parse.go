package query

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/internal/bsonraw"
)

// This file parses a query filter into matchers and predicates: logical
// operators, field conditions and each operator's operand, with the errors
// that name the operator and the field path.

func parseDoc(doc []byte) (matcher, error) {
	var ms []matcher
	it := bsonraw.NewIter(doc)
	for {
		k, t, v, ok := it.Next()
		if !ok {
			break
		}
		key := string(k)
		if strings.HasPrefix(key, "$") {
			switch key {
			case "$and", "$or", "$nor":
				m, err := parseLogical(key, t, v)
				if err != nil {
					return nil, err
				}
				ms = append(ms, m)
			case "$comment":
			case "$alwaysTrue":
				ms = append(ms, constMatcher(true))
			case "$alwaysFalse":
				ms = append(ms, constMatcher(false))
			default:
				return nil, fmt.Errorf("unknown top level operator %s", key)
			}
			continue
		}
		m, err := parseField(key, t, v)
		if err != nil {
			return nil, err
		}
		ms = append(ms, m)
	}
	switch len(ms) {
	case 0:
		return constMatcher(true), nil
	case 1:
		return ms[0], nil
	}
	return andMatcher(ms), nil
}

func parseLogical(op string, t bson.Type, v []byte) (matcher, error) {
	if t != bson.TypeArray || bsonraw.CountElems(v) == 0 {
		return nil, fmt.Errorf("%s needs a non-empty array", op)
	}
	var ms []matcher
	it := bsonraw.NewIter(v)
	for {
		_, et, ev, ok := it.Next()
		if !ok {
			break
		}
		if et != bson.TypeEmbeddedDocument {
			return nil, fmt.Errorf("%s entries must be documents", op)
		}
		m, err := parseDoc(ev)
		if err != nil {
			return nil, err
		}
		ms = append(ms, m)
	}
	switch op {
	case "$and":
		if len(ms) == 1 {
			return ms[0], nil
		}
		return andMatcher(ms), nil
	case "$or":
		if len(ms) == 1 {
			return ms[0], nil
		}
		return orMatcher(ms), nil
	}
	return norMatcher(ms), nil
}

func parseField(path string, t bson.Type, v []byte) (matcher, error) {
	parts := bsonraw.SplitPath(path)
	switch {
	case t == bson.TypeEmbeddedDocument && bsonraw.IsOperatorDoc(v):
		exprs, err := parseOps(path, v)
		if err != nil {
			return nil, err
		}
		return toMatcher(parts, exprs), nil
	case t == bson.TypeRegex:
		p, o := bsonraw.RegexParts(v)
		re, err := compileRegex(string(p), string(o))
		if err != nil {
			return nil, fmt.Errorf("%w at %s", err, path)
		}
		return &pathMatcher{path: parts, p: re}, nil
	case t == bson.TypeUndefined:
		return nil, fmt.Errorf("cannot compare to undefined at %s", path)
	}
	return &pathMatcher{path: parts, p: &eqPred{t: t, v: v}}, nil
}

// opExpr is one parsed operator of a field's operator document: a
// predicate, a negated predicate ($ne, $nin) or a $not of operators.
type opExpr struct {
	p   pred
	neg bool
	not []opExpr
}

func toMatcher(parts []bsonraw.PathPart, exprs []opExpr) matcher {
	ms := make([]matcher, 0, len(exprs))
	for _, e := range exprs {
		switch {
		case e.not != nil:
			ms = append(ms, notMatcher{toMatcher(parts, e.not)})
		case e.neg:
			ms = append(ms, notMatcher{&pathMatcher{path: parts, p: e.p}})
		default:
			ms = append(ms, &pathMatcher{path: parts, p: e.p})
		}
	}
	if len(ms) == 1 {
		return ms[0]
	}
	return andMatcher(ms)
}

func toPred(exprs []opExpr) pred {
	ps := make([]pred, 0, len(exprs))
	for _, e := range exprs {
		switch {
		case e.not != nil:
			ps = append(ps, notPred{toPred(e.not)})
		case e.neg:
			ps = append(ps, notPred{e.p})
		default:
			ps = append(ps, e.p)
		}
	}
	if len(ps) == 1 {
		return ps[0]
	}
	return andPred(ps)
}

func parseOps(path string, doc []byte) ([]opExpr, error) {
	var exprs []opExpr
	var regex *bson.RawValue
	var options *string
	fail := func(format string, args ...any) ([]opExpr, error) {
		return nil, fmt.Errorf(format+" at %s", append(args, path)...)
	}
	it := bsonraw.NewIter(doc)
	for {
		k, t, v, ok := it.Next()
		if !ok {
			break
		}
		op := string(k)
		switch op {
		case "$eq", "$ne":
			if t == bson.TypeUndefined {
				return fail("%s cannot compare to undefined", op)
			}
			if op == "$ne" && t == bson.TypeRegex {
				return fail("$ne cannot have a regex")
			}
			exprs = append(exprs, opExpr{p: &eqPred{t: t, v: v}, neg: op == "$ne"})
		case "$gt", "$gte", "$lt", "$lte":
			if t == bson.TypeUndefined {
				return fail("%s cannot compare to undefined", op)
			}
			c := &cmpPred{t: t, v: v, anyType: t == bson.TypeMinKey || t == bson.TypeMaxKey, nan: numIsNaN(t, v)}
			c.op = map[string]cmpOp{"$gt": opGT, "$gte": opGTE, "$lt": opLT, "$lte": opLTE}[op]
			exprs = append(exprs, opExpr{p: c})
		case "$in", "$nin":
			p, err := parseIn(op, t, v)
			if err != nil {
				return fail("%s", err)
			}
			exprs = append(exprs, opExpr{p: p, neg: op == "$nin"})
		case "$exists":
			if bsonraw.Truthy(t, v) {
				exprs = append(exprs, opExpr{p: existsPred{}})
			} else {
				exprs = append(exprs, opExpr{p: existsPred{}, neg: true})
			}
		case "$type":
			p, err := parseType(t, v)
			if err != nil {
				return fail("%s", err)
			}
			exprs = append(exprs, opExpr{p: p})
		case "$size":
			if !bsonraw.IsNumeric(t) {
				return fail("$size needs a number")
			}
			f := bsonraw.ToFloat(t, v)
			if f != math.Trunc(f) {
				return fail("$size must be a whole number")
			}
			if f < 0 {
				return fail("$size may not be negative")
			}
			exprs = append(exprs, opExpr{p: sizePred{n: int(f)}})
		case "$all":
			es, err := parseAll(path, t, v)
			if err != nil {
				return nil, err
			}
			exprs = append(exprs, es...)
		case "$elemMatch":
			p, err := parseElemMatch(path, t, v)
			if err != nil {
				return nil, err
			}
			exprs = append(exprs, opExpr{p: p})
		case "$mod":
			p, err := parseMod(t, v)
			if err != nil {
				return fail("%s", err)
			}
			exprs = append(exprs, opExpr{p: p})
		case "$not":
			switch {
			case t == bson.TypeRegex:
				p, o := bsonraw.RegexParts(v)
				re, err := compileRegex(string(p), string(o))
				if err != nil {
					return fail("%s", err)
				}
				exprs = append(exprs, opExpr{not: []opExpr{{p: re}}})
			case t == bson.TypeEmbeddedDocument:
				if bsonraw.CountElems(v) == 0 {
					return fail("$not cannot be empty")
				}
				if !bsonraw.IsOperatorDoc(v) {
					return fail("$not needs a regex or a document of operators")
				}
				sub, err := parseOps(path, v)
				if err != nil {
					return nil, err
				}
				exprs = append(exprs, opExpr{not: sub})
			default:
				return fail("$not needs a regex or a document")
			}
		case "$regex":
			if t != bson.TypeString && t != bson.TypeRegex {
				return fail("$regex has to be a string")
			}
			r := bsonraw.Value(t, v)
			regex = &r
		case "$options":
			if t != bson.TypeString {
				return fail("$options has to be a string")
			}
			s := string(bsonraw.Str(v))
			options = &s
		case "$comment":
		default:
			return fail("unknown operator %s", op)
		}
	}
	if options != nil && regex == nil {
		return fail("$options needs a $regex")
	}
	if regex != nil {
		var pattern, opts string
		if regex.Type == bson.TypeRegex {
			p, o := bsonraw.RegexParts(regex.Value)
			pattern, opts = string(p), string(o)
			if options != nil && opts != "" {
				return fail("$regex: options set in both $regex and $options")
			}
		} else {
			pattern = string(bsonraw.Str(regex.Value))
		}
		if options != nil {
			opts = *options
		}
		if strings.IndexByte(pattern, 0) >= 0 {
			return fail("$regex: regular expression cannot contain an embedded null byte")
		}
		re, err := compileRegex(pattern, opts)
		if err != nil {
			return fail("%s", err)
		}
		exprs = append(exprs, opExpr{p: re})
	}
	return exprs, nil
}

func parseIn(op string, t bson.Type, v []byte) (pred, error) {
	if t != bson.TypeArray {
		return nil, fmt.Errorf("%s needs an array", op)
	}
	in := &inPred{strs: map[string]struct{}{}}
	it := bsonraw.NewIter(v)
	for {
		_, et, ev, ok := it.Next()
		if !ok {
			break
		}
		switch et {
		case bson.TypeString, bson.TypeSymbol:
			in.strs[string(bsonraw.Str(ev))] = struct{}{}
		case bson.TypeRegex:
			p, o := bsonraw.RegexParts(ev)
			re, err := compileRegex(string(p), string(o))
			if err != nil {
				return nil, err
			}
			in.regexes = append(in.regexes, re)
		case bson.TypeUndefined:
			return nil, fmt.Errorf("%s cannot contain undefined", op)
		case bson.TypeEmbeddedDocument:
			if bsonraw.IsOperatorDoc(ev) {
				return nil, fmt.Errorf("%s cannot contain $ operators", op)
			}
			in.others = append(in.others, bsonraw.Value(et, ev))
		case bson.TypeNull:
			in.hasNull = true
			in.others = append(in.others, bsonraw.Value(et, ev))
		default:
			in.others = append(in.others, bsonraw.Value(et, ev))
		}
	}
	return in, nil
}

func parseType(t bson.Type, v []byte) (pred, error) {
	tp := &typePred{}
	add := func(t bson.Type, v []byte) error {
		switch {
		case t == bson.TypeString:
			name := string(bsonraw.Str(v))
			if name == "number" {
				tp.number = true
				return nil
			}
			bt, ok := bsonraw.TypeByAlias(name)
			if !ok {
				return fmt.Errorf("$type: unknown type name alias %s", name)
			}
			tp.types[byte(bt)] = true
		case bsonraw.IsNumeric(t):
			f := bsonraw.ToFloat(t, v)
			n := int(f)
			if float64(n) != f {
				return fmt.Errorf("$type: invalid numerical type code %v", f)
			}
			switch {
			case n == -1:
				tp.types[byte(bson.TypeMinKey)] = true
			case n == 127 || (n >= 1 && n <= 19):
				tp.types[byte(n)] = true
			default:
				return fmt.Errorf("$type: invalid numerical type code %d", n)
			}
		default:
			return errors.New("$type needs a type name or number, or an array of them")
		}
		return nil
	}
	if t == bson.TypeArray {
		it := bsonraw.NewIter(v)
		for {
			_, et, ev, ok := it.Next()
			if !ok {
				break
			}
			if err := add(et, ev); err != nil {
				return nil, err
			}
		}
		return tp, nil
	}
	if err := add(t, v); err != nil {
		return nil, err
	}
	return tp, nil
}

func parseAll(path string, t bson.Type, v []byte) ([]opExpr, error) {
	if t != bson.TypeArray {
		return nil, fmt.Errorf("$all needs an array at %s", path)
	}
	var exprs []opExpr
	it := bsonraw.NewIter(v)
	for {
		_, et, ev, ok := it.Next()
		if !ok {
			break
		}
		switch {
		case et == bson.TypeRegex:
			p, o := bsonraw.RegexParts(ev)
			re, err := compileRegex(string(p), string(o))
			if err != nil {
				return nil, fmt.Errorf("%w at %s", err, path)
			}
			exprs = append(exprs, opExpr{p: re})
		case et == bson.TypeEmbeddedDocument && bsonraw.IsOperatorDoc(ev):
			k, kt, kv := bsonraw.FirstElem(ev)
			if string(k) != "$elemMatch" {
				return nil, fmt.Errorf("$all cannot contain $ operators other than $elemMatch at %s", path)
			}
			p, err := parseElemMatch(path, kt, kv)
			if err != nil {
				return nil, err
			}
			exprs = append(exprs, opExpr{p: p})
		case et == bson.TypeUndefined:
			return nil, fmt.Errorf("$all cannot contain undefined at %s", path)
		default:
			exprs = append(exprs, opExpr{p: &eqPred{t: et, v: ev}})
		}
	}
	if len(exprs) == 0 {
		// {$all: []} matches nothing.
		return []opExpr{{p: constPred(false)}}, nil
	}
	return exprs, nil
}

func parseElemMatch(path string, t bson.Type, v []byte) (pred, error) {
	if t != bson.TypeEmbeddedDocument {
		return nil, fmt.Errorf("$elemMatch needs an object at %s", path)
	}
	switch {
	case IsCondition(v):
		exprs, err := parseOps(path, v)
		if err != nil {
			return nil, err
		}
		return &elemMatchValPred{p: toPred(exprs)}, nil
	default:
		m, err := parseDoc(v)
		if err != nil {
			return nil, err
		}
		return &elemMatchObjPred{m: m}, nil
	}
}

func isLogicalOp(k string) bool {
	switch k {
	case "$and", "$or", "$nor", "$where", "$expr", "$comment", "$alwaysTrue", "$alwaysFalse":
		return true
	}
	return false
}

func parseMod(t bson.Type, v []byte) (pred, error) {
	if t != bson.TypeArray {
		return nil, errors.New("malformed mod, needs to be an array")
	}
	var nums []bson.RawValue
	it := bsonraw.NewIter(v)
	for {
		_, et, ev, ok := it.Next()
		if !ok {
			break
		}
		nums = append(nums, bsonraw.Value(et, ev))
	}
	switch {
	case len(nums) < 2:
		return nil, errors.New("malformed mod, not enough elements")
	case len(nums) > 2:
		return nil, errors.New("malformed mod, too many elements")
	case !bsonraw.IsNumeric(nums[0].Type):
		return nil, errors.New("malformed mod, divisor not a number")
	case !bsonraw.IsNumeric(nums[1].Type):
		return nil, errors.New("malformed mod, remainder not a number")
	}
	d, ok1 := bsonraw.TruncInt(nums[0].Type, nums[0].Value)
	r, ok2 := bsonraw.TruncInt(nums[1].Type, nums[1].Value)
	if !ok1 || !ok2 {
		return nil, errors.New("malformed mod, divisor and remainder must be finite")
	}
	if d == 0 {
		return nil, errors.New("divisor cannot be 0")
	}
	return modPred{d: d, r: r}, nil
}
