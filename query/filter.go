package query

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/changegate/changegate/internal/bsonraw"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// Filter is a compiled MongoDB query filter. It is immutable and safe for
// concurrent use by multiple goroutines.
type Filter struct {
	root matcher
}

// Compile validates a MongoDB query filter and compiles it into a [Filter].
// A nil or empty filter matches every document.
//
// Supported: implicit equality (including embedded documents, arrays and
// regular expressions), $eq $ne $gt $gte $lt $lte $in $nin $exists $type
// $and $or $nor $not $regex/$options $size $all $elemMatch $mod, plus
// $comment, $alwaysTrue and $alwaysFalse at the top level. Anything else
// ($expr, $where, $text, geo and bitwise operators, $jsonSchema) is an
// error. Errors are lowercase and name the operator and the field path,
// for example "unknown operator $foo at fullDocument.total".
func Compile(filter bson.Raw) (*Filter, error) {
	if len(filter) == 0 {
		return &Filter{root: constMatcher(true)}, nil
	}
	if err := filter.Validate(); err != nil {
		return nil, fmt.Errorf("invalid filter document: %w", err)
	}
	m, err := parseDoc(filter)
	if err != nil {
		return nil, err
	}
	return &Filter{root: m}, nil
}

// MustCompile is like [Compile] but panics on error. It is meant for
// filters that are constants in code and tests.
func MustCompile(filter bson.Raw) *Filter {
	f, err := Compile(filter)
	if err != nil {
		panic("query: " + err.Error())
	}
	return f
}

// Match reports whether doc satisfies the filter. It does not allocate
// (except for $in over decimals and comparisons of decimal128 values),
// never modifies doc, and treats a malformed document as ending at the
// first malformed element.
func (f *Filter) Match(doc bson.Raw) bool {
	return f.root.matches(doc)
}

type matcher interface {
	matches(doc []byte) bool
}

type constMatcher bool

func (c constMatcher) matches([]byte) bool { return bool(c) }

type andMatcher []matcher

func (a andMatcher) matches(doc []byte) bool {
	for _, m := range a {
		if !m.matches(doc) {
			return false
		}
	}
	return true
}

type orMatcher []matcher

func (o orMatcher) matches(doc []byte) bool {
	for _, m := range o {
		if m.matches(doc) {
			return true
		}
	}
	return false
}

type norMatcher []matcher

func (o norMatcher) matches(doc []byte) bool {
	for _, m := range o {
		if m.matches(doc) {
			return false
		}
	}
	return true
}

type notMatcher struct{ m matcher }

func (n notMatcher) matches(doc []byte) bool { return !n.m.matches(doc) }

// pred is a predicate on the values a path resolves to.
type pred interface {
	// value reports whether a single present value satisfies the predicate.
	value(t bson.Type, v []byte) bool
	// missing reports whether an absent value satisfies the predicate.
	missing() bool
	// expand reports whether the elements of an array reached at the end
	// of the path are candidates too (besides the array itself).
	expand() bool
}

// pathMatcher matches when any value the path resolves to satisfies p.
type pathMatcher struct {
	path []bsonraw.PathPart
	p    pred
}

func (m *pathMatcher) matches(doc []byte) bool { return evalDoc(doc, m.path, m.p) }

func evalDoc(doc []byte, parts []bsonraw.PathPart, p pred) bool {
	t, v, ok := bsonraw.Lookup(doc, parts[0].Name)
	if !ok {
		return p.missing()
	}
	return evalValue(t, v, parts[1:], p)
}

// evalValue implements MongoDB's path traversal: an array met before the
// end of the path is traversed element by element (documents are descended
// into, a numeric component also indexes the array, and, as in MongoDB 8.0
// after SERVER-36681, scalar elements and empty arrays count as a missing
// value); an array at the end of the path matches if any element or the
// array as a whole matches.
func evalValue(t bson.Type, v []byte, rest []bsonraw.PathPart, p pred) bool {
	if len(rest) == 0 {
		if t == bson.TypeArray && p.expand() {
			it := bsonraw.NewIter(v)
			for {
				_, et, ev, ok := it.Next()
				if !ok {
					break
				}
				if p.value(et, ev) {
					return true
				}
			}
		}
		return p.value(t, v)
	}
	switch t {
	case bson.TypeEmbeddedDocument:
		return evalDoc(v, rest, p)
	case bson.TypeArray:
		part := rest[0]
		it := bsonraw.NewIter(v)
		produced := false
		for i := 0; ; i++ {
			_, et, ev, ok := it.Next()
			if !ok {
				break
			}
			if i == part.Index {
				produced = true
				if evalValue(et, ev, rest[1:], p) {
					return true
				}
			}
			if et == bson.TypeEmbeddedDocument {
				produced = true
				if evalDoc(ev, rest, p) {
					return true
				}
			} else if part.Index < 0 {
				produced = true
				if p.missing() {
					return true
				}
			}
		}
		if !produced {
			return p.missing()
		}
		return false
	default:
		return p.missing()
	}
}

// ---- predicates ----

type eqPred struct {
	t bson.Type
	v []byte
}

func (e *eqPred) value(t bson.Type, v []byte) bool {
	return typeRank(t) == typeRank(e.t) && compareValues(t, v, e.t, e.v) == 0
}
func (e *eqPred) missing() bool { return e.t == bson.TypeNull }
func (e *eqPred) expand() bool  { return true }

type cmpOp int

const (
	opLT cmpOp = iota
	opLTE
	opGT
	opGTE
)

type cmpPred struct {
	op      cmpOp
	t       bson.Type
	v       []byte
	anyType bool // operand is MinKey or MaxKey: compare across types
	nan     bool
}

func (c *cmpPred) value(t bson.Type, v []byte) bool {
	if !c.anyType && typeRank(t) != typeRank(c.t) {
		return false
	}
	if bsonraw.IsNumeric(t) && bsonraw.IsNumeric(c.t) && (c.nan || numIsNaN(t, v)) {
		// NaN only compares equal to NaN; ordering comparisons with NaN
		// are false.
		return c.nan && numIsNaN(t, v) && (c.op == opLTE || c.op == opGTE)
	}
	return c.test(compareValues(t, v, c.t, c.v))
}

func (c *cmpPred) test(r int) bool {
	switch c.op {
	case opLT:
		return r < 0
	case opLTE:
		return r <= 0
	case opGT:
		return r > 0
	}
	return r >= 0
}

func (c *cmpPred) missing() bool {
	if c.t == bson.TypeNull || c.anyType {
		return c.test(compareValues(bson.TypeNull, nil, c.t, c.v))
	}
	return false
}
func (c *cmpPred) expand() bool { return true }

type inPred struct {
	strs    map[string]struct{}
	others  []bson.RawValue
	regexes []*regexPred
	hasNull bool
}

func (in *inPred) value(t bson.Type, v []byte) bool {
	if t == bson.TypeString || t == bson.TypeSymbol {
		if _, ok := in.strs[string(bsonraw.Str(v))]; ok {
			return true
		}
	} else {
		r := typeRank(t)
		for _, o := range in.others {
			if typeRank(o.Type) == r && compareValues(t, v, o.Type, o.Value) == 0 {
				return true
			}
		}
	}
	for _, re := range in.regexes {
		if re.value(t, v) {
			return true
		}
	}
	return false
}
func (in *inPred) missing() bool { return in.hasNull }
func (in *inPred) expand() bool  { return true }

type existsPred struct{}

func (existsPred) value(bson.Type, []byte) bool { return true }
func (existsPred) missing() bool                { return false }
func (existsPred) expand() bool                 { return false }

type typePred struct {
	types  [256]bool
	number bool
}

func (tp *typePred) value(t bson.Type, _ []byte) bool {
	return tp.types[byte(t)] || (tp.number && bsonraw.IsNumeric(t))
}
func (tp *typePred) missing() bool { return false }
func (tp *typePred) expand() bool  { return true }

type sizePred struct{ n int }

func (s sizePred) value(t bson.Type, v []byte) bool {
	return t == bson.TypeArray && bsonraw.CountElems(v) == s.n
}
func (sizePred) missing() bool { return false }
func (sizePred) expand() bool  { return false }

type modPred struct{ d, r int64 }

func (m modPred) value(t bson.Type, v []byte) bool {
	x, ok := bsonraw.TruncInt(t, v)
	return ok && x%m.d == m.r
}
func (modPred) missing() bool { return false }
func (modPred) expand() bool  { return true }

type elemMatchObjPred struct{ m matcher }

func (e *elemMatchObjPred) value(t bson.Type, v []byte) bool {
	if t != bson.TypeArray {
		return false
	}
	it := bsonraw.NewIter(v)
	for {
		_, et, ev, ok := it.Next()
		if !ok {
			return false
		}
		if (et == bson.TypeEmbeddedDocument || et == bson.TypeArray) && e.m.matches(ev) {
			return true
		}
	}
}
func (*elemMatchObjPred) missing() bool { return false }
func (*elemMatchObjPred) expand() bool  { return false }

type elemMatchValPred struct{ p pred }

func (e *elemMatchValPred) value(t bson.Type, v []byte) bool {
	if t != bson.TypeArray {
		return false
	}
	it := bsonraw.NewIter(v)
	for {
		_, et, ev, ok := it.Next()
		if !ok {
			return false
		}
		if e.p.value(et, ev) {
			return true
		}
	}
}
func (*elemMatchValPred) missing() bool { return false }
func (*elemMatchValPred) expand() bool  { return false }

type andPred []pred

func (a andPred) value(t bson.Type, v []byte) bool {
	for _, p := range a {
		if !p.value(t, v) {
			return false
		}
	}
	return true
}
func (a andPred) missing() bool {
	for _, p := range a {
		if !p.missing() {
			return false
		}
	}
	return true
}
func (andPred) expand() bool { return false }

type notPred struct{ p pred }

func (n notPred) value(t bson.Type, v []byte) bool { return !n.p.value(t, v) }
func (n notPred) missing() bool                    { return !n.p.missing() }
func (notPred) expand() bool                       { return false }

type constPred bool

func (c constPred) value(bson.Type, []byte) bool { return bool(c) }
func (c constPred) missing() bool                { return bool(c) }
func (constPred) expand() bool                   { return false }

// ---- parsing ----

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
