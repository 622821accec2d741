package mongowire

// This file is the seam between the server and query semantics (filters,
// sorts, projections, updates). It is a small interim evaluator until the
// shared package github.com/changegate/changegate/query is available.

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// matcher is a compiled query filter.
type matcher interface {
	Match(doc bson.Raw) bool
}

// sorter is a compiled sort specification.
type sorter interface {
	Compare(a, b bson.Raw) int
}

// updateDesc describes an operator update for change events.
type updateDesc struct {
	UpdatedFields   bson.D
	RemovedFields   []string
	TruncatedArrays bson.A
}

type matchAll struct{}

func (matchAll) Match(bson.Raw) bool { return true }

// compileFilter compiles a query filter; an empty or nil filter matches all.
func compileFilter(filter bson.Raw) (matcher, error) {
	if len(filter) <= 5 {
		return matchAll{}, nil
	}
	return compileSimple(filter)
}

// compareValues orders BSON values with MongoDB's type-bracketed order.
func compareValues(a, b bson.RawValue) int {
	ra, rb := typeRank(a.Type), typeRank(b.Type)
	if ra != rb {
		if ra < rb {
			return -1
		}
		return 1
	}
	switch {
	case a.IsNumber() && b.IsNumber():
		fa, fb := num(a), num(b)
		switch {
		case fa < fb:
			return -1
		case fa > fb:
			return 1
		}
		return 0
	case a.Type == bson.TypeString || a.Type == bson.TypeSymbol:
		return strings.Compare(a.StringValue(), b.StringValue())
	case a.Type == bson.TypeEmbeddedDocument || a.Type == bson.TypeArray:
		ea, _ := bson.Raw(a.Value).Elements()
		eb, _ := bson.Raw(b.Value).Elements()
		for i := 0; i < len(ea) && i < len(eb); i++ {
			if a.Type == bson.TypeEmbeddedDocument {
				if c := compareValues(typeVal(ea[i].Value().Type), typeVal(eb[i].Value().Type)); c != 0 {
					return c
				}
				if c := strings.Compare(ea[i].Key(), eb[i].Key()); c != 0 {
					return c
				}
			}
			if c := compareValues(ea[i].Value(), eb[i].Value()); c != 0 {
				return c
			}
		}
		return cmpInt(len(ea), len(eb))
	case a.Type == bson.TypeBoolean:
		return cmpInt(b2i(a.Boolean()), b2i(b.Boolean()))
	case a.Type == bson.TypeDateTime:
		return cmpInt64(a.DateTime(), b.DateTime())
	case a.Type == bson.TypeTimestamp:
		at, ai := a.Timestamp()
		bt, bi := b.Timestamp()
		if at != bt {
			return cmpInt64(int64(at), int64(bt))
		}
		return cmpInt64(int64(ai), int64(bi))
	}
	return bytes.Compare(a.Value, b.Value)
}

func typeVal(t bson.Type) bson.RawValue {
	return bson.RawValue{Type: bson.TypeInt32, Value: []byte{byte(typeRank(t)), 0, 0, 0}}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func cmpInt(a, b int) int { return cmpInt64(int64(a), int64(b)) }

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func num(v bson.RawValue) float64 {
	switch v.Type {
	case bson.TypeInt32:
		return float64(v.Int32())
	case bson.TypeInt64:
		return float64(v.Int64())
	case bson.TypeDouble:
		return v.Double()
	case bson.TypeDecimal128:
		f, _ := strconv.ParseFloat(v.Decimal128().String(), 64)
		return f
	}
	return math.NaN()
}

func typeRank(t bson.Type) int {
	switch t {
	case bson.TypeMinKey:
		return -1
	case 0, bson.TypeNull, bson.TypeUndefined:
		return 5
	case bson.TypeDouble, bson.TypeInt32, bson.TypeInt64, bson.TypeDecimal128:
		return 10
	case bson.TypeString, bson.TypeSymbol:
		return 15
	case bson.TypeEmbeddedDocument:
		return 20
	case bson.TypeArray:
		return 25
	case bson.TypeBinary:
		return 30
	case bson.TypeObjectID:
		return 35
	case bson.TypeBoolean:
		return 40
	case bson.TypeDateTime:
		return 45
	case bson.TypeTimestamp:
		return 47
	case bson.TypeRegex:
		return 50
	case bson.TypeMaxKey:
		return 127
	}
	return 100
}

// lookupPath returns the values a dotted path reaches, descending into arrays.
func lookupPath(doc bson.Raw, path string) []bson.RawValue {
	return lookupParts(bson.RawValue{Type: bson.TypeEmbeddedDocument, Value: doc}, strings.Split(path, "."))
}

func lookupParts(v bson.RawValue, parts []string) []bson.RawValue {
	if len(parts) == 0 {
		return []bson.RawValue{v}
	}
	switch v.Type {
	case bson.TypeEmbeddedDocument:
		f, err := bson.Raw(v.Value).LookupErr(parts[0])
		if err != nil {
			return nil
		}
		return lookupParts(f, parts[1:])
	case bson.TypeArray:
		if _, err := strconv.Atoi(parts[0]); err == nil {
			f, err := bson.Raw(v.Value).LookupErr(parts[0])
			if err == nil {
				return lookupParts(f, parts[1:])
			}
		}
		var out []bson.RawValue
		vals, _ := bson.Raw(v.Value).Values()
		for _, e := range vals {
			if e.Type == bson.TypeEmbeddedDocument {
				out = append(out, lookupParts(e, parts)...)
			}
		}
		return out
	}
	return nil
}

type predicate func(doc bson.Raw) bool

type simpleMatcher struct{ preds []predicate }

func (m *simpleMatcher) Match(doc bson.Raw) bool {
	for _, p := range m.preds {
		if !p(doc) {
			return false
		}
	}
	return true
}

func compileSimple(filter bson.Raw) (*simpleMatcher, error) {
	elems, err := filter.Elements()
	if err != nil {
		return nil, err
	}
	m := &simpleMatcher{}
	for _, e := range elems {
		key, val := e.Key(), e.Value()
		switch key {
		case "$and", "$or", "$nor":
			arr, ok := val.ArrayOK()
			if !ok {
				return nil, fmt.Errorf("%s must be an array", key)
			}
			subs, _ := arr.Values()
			var ms []*simpleMatcher
			for _, s := range subs {
				d, ok := s.DocumentOK()
				if !ok {
					return nil, fmt.Errorf("%s entries must be objects", key)
				}
				sm, err := compileSimple(d)
				if err != nil {
					return nil, err
				}
				ms = append(ms, sm)
			}
			op := key
			m.preds = append(m.preds, func(doc bson.Raw) bool {
				any := false
				for _, sm := range ms {
					r := sm.Match(doc)
					if op == "$and" && !r {
						return false
					}
					any = any || r
				}
				switch op {
				case "$or":
					return any
				case "$nor":
					return !any
				}
				return true
			})
			continue
		case "$comment":
			continue
		}
		if strings.HasPrefix(key, "$") {
			return nil, fmt.Errorf("unknown top level operator: %s", key)
		}
		p, err := compileField(key, val)
		if err != nil {
			return nil, err
		}
		m.preds = append(m.preds, p)
	}
	return m, nil
}

func isOperatorDoc(v bson.RawValue) bool {
	d, ok := v.DocumentOK()
	if !ok {
		return false
	}
	e, err := d.IndexErr(0)
	return err == nil && strings.HasPrefix(e.Key(), "$")
}

func compileField(path string, val bson.RawValue) (predicate, error) {
	if !isOperatorDoc(val) {
		if val.Type == bson.TypeRegex {
			return compileOp(path, "$regex", val, bson.Raw(nil))
		}
		return compileOp(path, "$eq", val, nil)
	}
	ops, _ := val.Document().Elements()
	var preds []predicate
	for _, o := range ops {
		if o.Key() == "$options" {
			continue
		}
		p, err := compileOp(path, o.Key(), o.Value(), val.Document())
		if err != nil {
			return nil, err
		}
		preds = append(preds, p)
	}
	return func(doc bson.Raw) bool {
		for _, p := range preds {
			if !p(doc) {
				return false
			}
		}
		return true
	}, nil
}

// anyValue reports whether pred holds for a value the path reaches, or for an
// element of an array it reaches.
func anyValue(doc bson.Raw, path string, pred func(bson.RawValue) bool) bool {
	vals := lookupPath(doc, path)
	if len(vals) == 0 {
		return pred(bson.RawValue{})
	}
	for _, v := range vals {
		if pred(v) {
			return true
		}
		if v.Type == bson.TypeArray {
			elems, _ := bson.Raw(v.Value).Values()
			for _, e := range elems {
				if pred(e) {
					return true
				}
			}
		}
	}
	return false
}

func eqValue(a, b bson.RawValue) bool {
	if (a.Type == 0 || a.Type == bson.TypeNull) && b.Type == bson.TypeNull {
		return true
	}
	if typeRank(a.Type) != typeRank(b.Type) {
		return false
	}
	return compareValues(a, b) == 0
}

func compileOp(path, op string, arg bson.RawValue, opDoc bson.Raw) (predicate, error) {
	switch op {
	case "$eq":
		return func(d bson.Raw) bool { return anyValue(d, path, func(v bson.RawValue) bool { return eqValue(v, arg) }) }, nil
	case "$ne":
		return func(d bson.Raw) bool {
			return !anyValue(d, path, func(v bson.RawValue) bool { return eqValue(v, arg) })
		}, nil
	case "$gt", "$gte", "$lt", "$lte":
		return func(d bson.Raw) bool {
			return anyValue(d, path, func(v bson.RawValue) bool {
				if v.Type == 0 || typeRank(v.Type) != typeRank(arg.Type) {
					return false
				}
				c := compareValues(v, arg)
				switch op {
				case "$gt":
					return c > 0
				case "$gte":
					return c >= 0
				case "$lt":
					return c < 0
				}
				return c <= 0
			})
		}, nil
	case "$in", "$nin":
		arr, ok := arg.ArrayOK()
		if !ok {
			return nil, fmt.Errorf("%s needs an array", op)
		}
		cands, _ := arr.Values()
		in := func(d bson.Raw) bool {
			return anyValue(d, path, func(v bson.RawValue) bool {
				for _, c := range cands {
					if eqValue(v, c) {
						return true
					}
				}
				return false
			})
		}
		if op == "$nin" {
			return func(d bson.Raw) bool { return !in(d) }, nil
		}
		return in, nil
	case "$exists":
		want := truthy(arg)
		return func(d bson.Raw) bool { return (len(lookupPath(d, path)) > 0) == want }, nil
	case "$not":
		p, err := compileField(path, arg)
		if err != nil {
			return nil, err
		}
		return func(d bson.Raw) bool { return !p(d) }, nil
	case "$regex":
		pat, opts := "", ""
		if arg.Type == bson.TypeRegex {
			pat, opts = arg.Regex()
		} else {
			pat = arg.StringValue()
			if o, ok := opDoc.Lookup("$options").StringValueOK(); ok {
				opts = o
			}
		}
		flags := ""
		for _, c := range opts {
			if strings.ContainsRune("imsx", c) && c != 'x' {
				flags += string(c)
			}
		}
		if flags != "" {
			pat = "(?" + flags + ")" + pat
		}
		re, err := regexp.Compile(pat)
		if err != nil {
			return nil, err
		}
		return func(d bson.Raw) bool {
			return anyValue(d, path, func(v bson.RawValue) bool {
				s, ok := v.StringValueOK()
				return ok && re.MatchString(s)
			})
		}, nil
	case "$size":
		n := num(arg)
		return func(d bson.Raw) bool {
			for _, v := range lookupPath(d, path) {
				if a, ok := v.ArrayOK(); ok {
					vals, _ := a.Values()
					if float64(len(vals)) == n {
						return true
					}
				}
			}
			return false
		}, nil
	}
	return nil, fmt.Errorf("unknown operator: %s", op)
}

func truthy(v bson.RawValue) bool {
	switch v.Type {
	case bson.TypeBoolean:
		return v.Boolean()
	case bson.TypeNull, 0:
		return false
	}
	if v.IsNumber() {
		return num(v) != 0
	}
	return true
}

type fieldSort struct {
	keys []string
	dirs []int
}

// compileSort compiles a sort specification such as {a: 1, b: -1}.
func compileSort(spec bson.Raw) (sorter, error) {
	elems, err := spec.Elements()
	if err != nil {
		return nil, err
	}
	s := &fieldSort{}
	for _, e := range elems {
		d := 1
		if num(e.Value()) < 0 {
			d = -1
		}
		s.keys = append(s.keys, e.Key())
		s.dirs = append(s.dirs, d)
	}
	return s, nil
}

func sortKey(doc bson.Raw, path string, dir int) bson.RawValue {
	vals := lookupPath(doc, path)
	if len(vals) == 0 {
		return bson.RawValue{Type: bson.TypeNull}
	}
	return vals[0]
}

func (s *fieldSort) Compare(a, b bson.Raw) int {
	for i, k := range s.keys {
		if c := compareValues(sortKey(a, k, s.dirs[i]), sortKey(b, k, s.dirs[i])); c != 0 {
			return c * s.dirs[i]
		}
	}
	return 0
}

// project applies a find-style projection.
func project(doc bson.Raw, projection bson.Raw) (bson.Raw, error) {
	elems, err := projection.Elements()
	if err != nil || len(elems) == 0 {
		return doc, err
	}
	include, idSeen, idOn := false, false, true
	fields := map[string]bool{}
	for _, e := range elems {
		on := truthy(e.Value())
		if e.Key() == "_id" {
			idSeen, idOn = true, on
			continue
		}
		include = on
		fields[e.Key()] = true
	}
	_ = idSeen
	var d bson.D
	if err := bson.Unmarshal(doc, &d); err != nil {
		return nil, err
	}
	var out bson.D
	for _, f := range d {
		switch {
		case f.Key == "_id":
			if idOn {
				out = append(out, f)
			}
		case include:
			if fields[f.Key] {
				out = append(out, f)
			} else if sub, ok := f.Value.(bson.D); ok {
				prefix := f.Key + "."
				var spec bson.D
				for k := range fields {
					if strings.HasPrefix(k, prefix) {
						spec = append(spec, bson.E{Key: k[len(prefix):], Value: 1})
					}
				}
				if len(spec) > 0 {
					spec = append(spec, bson.E{Key: "_id", Value: 0})
					raw, _ := bson.Marshal(sub)
					rs, _ := bson.Marshal(spec)
					p, err := project(raw, rs)
					if err != nil {
						return nil, err
					}
					out = append(out, bson.E{Key: f.Key, Value: p})
				}
			}
		default:
			if !fields[f.Key] {
				out = append(out, f)
			}
		}
	}
	return bson.Marshal(out)
}

// isReplacement reports whether an update document is a replacement.
func isReplacement(update bson.Raw) bool {
	e, err := update.IndexErr(0)
	return err != nil || !strings.HasPrefix(e.Key(), "$")
}

// upsertSeed returns the equality fields of a filter, to seed an upsert.
func upsertSeed(filter bson.Raw) (bson.D, error) {
	elems, err := filter.Elements()
	if err != nil {
		return nil, err
	}
	var out bson.D
	for _, e := range elems {
		if strings.HasPrefix(e.Key(), "$") || strings.Contains(e.Key(), ".") {
			continue
		}
		v := e.Value()
		if isOperatorDoc(v) {
			if eq, err := v.Document().LookupErr("$eq"); err == nil {
				v = eq
			} else {
				continue
			}
		}
		out = append(out, bson.E{Key: e.Key(), Value: v})
	}
	return out, nil
}

var errImmutableID = errors.New("immutable _id")

// applyUpdate applies an operator update document.
func applyUpdate(doc bson.Raw, update bson.Raw, insert bool, now time.Time) (bson.Raw, *updateDesc, error) {
	var d bson.D
	if err := bson.Unmarshal(doc, &d); err != nil {
		return nil, nil, err
	}
	desc := &updateDesc{}
	ops, err := update.Elements()
	if err != nil {
		return nil, nil, err
	}
	for _, o := range ops {
		args, ok := o.Value().DocumentOK()
		if !ok {
			return nil, nil, fmt.Errorf("modifier %s needs an object", o.Key())
		}
		fields, _ := args.Elements()
		for _, f := range fields {
			path, v := f.Key(), f.Value()
			if path == "_id" && o.Key() != "$setOnInsert" {
				if cur := lookupPath(doc, "_id"); len(cur) == 1 && eqValue(cur[0], v) && o.Key() == "$set" {
					continue
				}
				if !insert {
					return nil, nil, errImmutableID
				}
			}
			switch o.Key() {
			case "$set":
				d = setPath(d, path, v)
			case "$setOnInsert":
				if insert {
					d = setPath(d, path, v)
				}
				continue
			case "$unset":
				var removed bool
				d, removed = unsetPath(d, path)
				if removed {
					desc.RemovedFields = append(desc.RemovedFields, path)
				}
				continue
			case "$inc":
				cur, _ := getPath(d, path)
				nv, err := incValue(cur, v)
				if err != nil {
					return nil, nil, err
				}
				d = setPath(d, path, nv)
			case "$currentDate":
				d = setPath(d, path, bson.NewDateTimeFromTime(now))
			case "$push":
				cur, _ := getPath(d, path)
				arr, _ := cur.(bson.A)
				if cur != nil && arr == nil {
					return nil, nil, fmt.Errorf("the field '%s' must be an array", path)
				}
				if each, ok := v.DocumentOK(); ok {
					if ev, err := each.LookupErr("$each"); err == nil {
						items, _ := ev.Array().Values()
						for _, it := range items {
							arr = append(arr, it)
						}
						d = setPath(d, path, arr)
						break
					}
				}
				d = setPath(d, path, append(arr, v))
			default:
				return nil, nil, fmt.Errorf("unknown modifier: %s", o.Key())
			}
			nv, _ := getPath(d, path)
			desc.UpdatedFields = append(desc.UpdatedFields, bson.E{Key: path, Value: nv})
		}
	}
	out, err := bson.Marshal(d)
	if err != nil {
		return nil, nil, err
	}
	sort.Strings(desc.RemovedFields)
	return out, desc, nil
}

func incValue(cur any, by bson.RawValue) (any, error) {
	if cur == nil {
		return by, nil
	}
	switch c := cur.(type) {
	case int32:
		if by.Type == bson.TypeInt32 {
			return c + by.Int32(), nil
		}
		if by.Type == bson.TypeInt64 {
			return int64(c) + by.Int64(), nil
		}
		return float64(c) + num(by), nil
	case int64:
		if by.Type == bson.TypeInt32 || by.Type == bson.TypeInt64 {
			return c + int64(num(by)), nil
		}
		return float64(c) + num(by), nil
	case float64:
		return c + num(by), nil
	}
	return nil, fmt.Errorf("cannot apply $inc to a value of non-numeric type")
}

func getPath(d bson.D, path string) (any, bool) {
	head, rest, nested := strings.Cut(path, ".")
	for _, e := range d {
		if e.Key == head {
			if !nested {
				return e.Value, true
			}
			if sub, ok := e.Value.(bson.D); ok {
				return getPath(sub, rest)
			}
			return nil, false
		}
	}
	return nil, false
}

func setPath(d bson.D, path string, v any) bson.D {
	head, rest, nested := strings.Cut(path, ".")
	for i, e := range d {
		if e.Key == head {
			if !nested {
				d[i].Value = v
				return d
			}
			sub, _ := e.Value.(bson.D)
			d[i].Value = setPath(sub, rest, v)
			return d
		}
	}
	if !nested {
		return append(d, bson.E{Key: head, Value: v})
	}
	return append(d, bson.E{Key: head, Value: setPath(nil, rest, v)})
}

func unsetPath(d bson.D, path string) (bson.D, bool) {
	head, rest, nested := strings.Cut(path, ".")
	for i, e := range d {
		if e.Key == head {
			if !nested {
				return append(d[:i:i], d[i+1:]...), true
			}
			sub, ok := e.Value.(bson.D)
			if !ok {
				return d, false
			}
			var removed bool
			d[i].Value, removed = unsetPath(sub, rest)
			return d, removed
		}
	}
	return d, false
}
