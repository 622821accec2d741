package mongowire

// An aggregation-expression evaluator: what update pipelines, $expr
// filters and the $addFields/$set/$replaceWith stages need, not the whole
// language.
//
// Behaviour follows the MongoDB 8.0 manual's pages of each operator
// (reference/operator/aggregation/<name>) and, where the manual is silent,
// src/mongo/db/pipeline/expression.cpp:
//   - field paths ("$a.b") descend into documents and map over arrays,
//     dropping elements that are not documents or lack the field (numeric
//     path components are field names, not array indexes);
//   - $$NOW is one date per command (the caller passes it), $$ROOT and
//     $$CURRENT the document, $$REMOVE is missing;
//   - comparisons ($eq ... $gte, $max, $min) use BSON comparison order
//     (query.Compare) where missing and undefined share canonical type 0
//     below null (bsontypes.h canonicalizeBSONType), so
//     {$eq: ["$missing", null]} is false and {$lt: ["$missing", <date>]} is
//     true;
//   - truthiness ($cond, $and, $or, $not): false, null, missing, undefined
//     and numeric zero are false, everything else true;
//   - $add/$subtract/$multiply return the narrowest of int, long, double
//     that holds the result (an int overflow widens to long, a long one to
//     double: ExpressionAdd::evaluate), a date plus or minus numbers is a
//     date, date minus date a long of milliseconds; a null or missing
//     operand makes the result null. Non-integral milliseconds added to a
//     date are rounded to the nearest integer (ExpressionAdd converts the
//     double-double sum with getLong; ties are not pinned by a test).
//     Decimal128 arithmetic is not implemented (an error).
//   - $mod keeps the widest integral type, errors 16610 on a zero divisor;
//     $abs of the smallest int is a long, of the smallest long error 28680;
//     $toLong converts bool, numbers, dates and decimal strings, error 241
//     (ConversionFailure) when it cannot.

import (
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/changegate/changegate/internal/mhash"
	"github.com/changegate/changegate/query"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Server error codes of the expression language.
const (
	codeInvalidPipelineOperator = 168
	codeConversionFailure       = 241
)

// exprEnv is what an expression sees: the document ($$ROOT, $$CURRENT,
// field paths) and the command's clock ($$NOW).
type exprEnv struct {
	root bson.Raw
	now  time.Time
}

var (
	valMissing = bson.RawValue{}
	valNull    = bson.RawValue{Type: bson.TypeNull}
	valTrue    = bson.RawValue{Type: bson.TypeBoolean, Value: []byte{1}}
	valFalse   = bson.RawValue{Type: bson.TypeBoolean, Value: []byte{0}}
)

func boolVal(b bool) bson.RawValue {
	if b {
		return valTrue
	}
	return valFalse
}

func int32Val(i int32) bson.RawValue {
	return bson.RawValue{Type: bson.TypeInt32, Value: bsoncore.AppendInt32(nil, i)}
}

func int64Val(i int64) bson.RawValue {
	return bson.RawValue{Type: bson.TypeInt64, Value: bsoncore.AppendInt64(nil, i)}
}

func doubleVal(f float64) bson.RawValue {
	return bson.RawValue{Type: bson.TypeDouble, Value: bsoncore.AppendDouble(nil, f)}
}

func dateVal(ms int64) bson.RawValue {
	return bson.RawValue{Type: bson.TypeDateTime, Value: bsoncore.AppendDateTime(nil, ms)}
}

// intOrLong is Value::createIntOrLong.
func intOrLong(i int64) bson.RawValue {
	if i >= math.MinInt32 && i <= math.MaxInt32 {
		return int32Val(int32(i))
	}
	return int64Val(i)
}

func nullish(v bson.RawValue) bool {
	return v.Type == 0 || v.Type == bson.TypeNull || v.Type == bson.TypeUndefined
}

// truthy is Value::coerceToBool.
func truthy(v bson.RawValue) bool {
	switch v.Type {
	case 0, bson.TypeNull, bson.TypeUndefined:
		return false
	case bson.TypeBoolean:
		return v.Boolean()
	case bson.TypeInt32:
		return v.Int32() != 0
	case bson.TypeInt64:
		return v.Int64() != 0
	case bson.TypeDouble:
		return v.Double() != 0
	case bson.TypeDecimal128:
		f, _ := strconv.ParseFloat(v.Decimal128().String(), 64)
		return f != 0
	}
	return true
}

// exprCompare orders two values as aggregation does (Value::compare):
// missing and undefined are equal and below everything but MinKey.
func exprCompare(a, b bson.RawValue) int {
	low := func(v bson.RawValue) bool { return v.Type == 0 || v.Type == bson.TypeUndefined }
	switch la, lb := low(a), low(b); {
	case la && lb:
		return 0
	case la:
		if b.Type == bson.TypeMinKey {
			return 1
		}
		return -1
	case lb:
		if a.Type == bson.TypeMinKey {
			return -1
		}
		return 1
	}
	return query.Compare(a, b)
}

// evalExpression evaluates expression e against env. The result is missing
// (Type 0) when a field path reaches nothing or $$REMOVE is used.
func evalExpression(env *exprEnv, e bson.RawValue) (bson.RawValue, error) {
	switch e.Type {
	case bson.TypeString:
		s := e.StringValue()
		if strings.HasPrefix(s, "$") {
			return evalPath(env, s)
		}
		return e, nil
	case bson.TypeArray:
		vals, err := bson.Raw(e.Value).Values()
		if err != nil {
			return valMissing, cmdErr(codeBadValue, "%v", err)
		}
		out := make([]bson.RawValue, 0, len(vals))
		for _, v := range vals {
			r, err := evalExpression(env, v)
			if err != nil {
				return valMissing, err
			}
			if r.Type == 0 {
				r = valNull // a missing value inside an array literal is null
			}
			out = append(out, r)
		}
		return arrayVal(out), nil
	case bson.TypeEmbeddedDocument:
		doc := bson.Raw(e.Value)
		elems, err := doc.Elements()
		if err != nil {
			return valMissing, cmdErr(codeBadValue, "%v", err)
		}
		if len(elems) > 0 && strings.HasPrefix(elems[0].Key(), "$") {
			if len(elems) != 1 {
				return valMissing, cmdErr(15983, "an expression specification must contain exactly one field, the name of the expression. Found %d fields in %s", len(elems), doc)
			}
			return evalOperator(env, elems[0].Key(), elems[0].Value())
		}
		idx, out := bsoncore.AppendDocumentStart(nil)
		for _, el := range elems {
			if strings.HasPrefix(el.Key(), "$") {
				return valMissing, cmdErr(16404, "a field name in an object expression cannot start with '$': %s", el.Key())
			}
			v, err := evalExpression(env, el.Value())
			if err != nil {
				return valMissing, err
			}
			if v.Type != 0 {
				out = bsoncore.AppendValueElement(out, el.Key(), bsoncore.Value{Type: bsoncore.Type(v.Type), Data: v.Value})
			}
		}
		out, _ = bsoncore.AppendDocumentEnd(out, idx)
		return bson.RawValue{Type: bson.TypeEmbeddedDocument, Value: out}, nil
	}
	return e, nil
}

func arrayVal(vals []bson.RawValue) bson.RawValue {
	idx, out := bsoncore.AppendArrayStart(nil)
	for i, v := range vals {
		out = bsoncore.AppendValueElement(out, arrayKey(i), bsoncore.Value{Type: bsoncore.Type(v.Type), Data: v.Value})
	}
	out, _ = bsoncore.AppendArrayEnd(out, idx)
	return bson.RawValue{Type: bson.TypeArray, Value: out}
}

// evalPath resolves "$a.b" and "$$VAR.a.b".
func evalPath(env *exprEnv, s string) (bson.RawValue, error) {
	root := bson.RawValue{Type: bson.TypeEmbeddedDocument, Value: env.root}
	if !strings.HasPrefix(s, "$$") {
		if s == "$" {
			return valMissing, cmdErr(16872, "'$' by itself is not a valid FieldPath")
		}
		return aggPath(root, strings.Split(s[1:], ".")), nil
	}
	name, rest, _ := strings.Cut(s[2:], ".")
	var base bson.RawValue
	switch name {
	case "ROOT", "CURRENT":
		base = root
	case "NOW":
		base = dateVal(env.now.UnixMilli())
	case "REMOVE":
		return valMissing, nil
	case "KEEP", "PRUNE", "DESCEND": // $redact's results (aggproject.go)
		return bson.RawValue{Type: bson.TypeString, Value: bsoncore.AppendString(nil, "$$"+name)}, nil
	default:
		return valMissing, cmdErr(17276, "Use of undefined variable: %s", name)
	}
	if rest == "" {
		return base, nil
	}
	return aggPath(base, strings.Split(rest, ".")), nil
}

// aggPath is an aggregation field path: documents are descended, arrays
// mapped (elements that yield nothing are dropped).
func aggPath(v bson.RawValue, parts []string) bson.RawValue {
	if len(parts) == 0 {
		return v
	}
	switch v.Type {
	case bson.TypeEmbeddedDocument:
		f, err := bson.Raw(v.Value).LookupErr(parts[0])
		if err != nil {
			return valMissing
		}
		return aggPath(f, parts[1:])
	case bson.TypeArray:
		vals, _ := bson.Raw(v.Value).Values()
		out := make([]bson.RawValue, 0, len(vals))
		for _, el := range vals {
			if el.Type != bson.TypeEmbeddedDocument && el.Type != bson.TypeArray {
				continue
			}
			if r := aggPath(el, parts); r.Type != 0 {
				out = append(out, r)
			}
		}
		return arrayVal(out)
	}
	return valMissing
}

// operands returns an operator's argument expressions: the elements of an
// array operand, or the operand itself.
func operands(arg bson.RawValue) []bson.RawValue {
	if arg.Type == bson.TypeArray {
		vals, _ := bson.Raw(arg.Value).Values()
		return vals
	}
	return []bson.RawValue{arg}
}

func evalAll(env *exprEnv, args []bson.RawValue) ([]bson.RawValue, error) {
	out := make([]bson.RawValue, len(args))
	for i, a := range args {
		v, err := evalExpression(env, a)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

func arity(op string, args []bson.RawValue, n int) error {
	if len(args) != n {
		return cmdErr(16020, "Expression %s takes exactly %d arguments. %d were passed in.", op, n, len(args))
	}
	return nil
}

func evalOperator(env *exprEnv, op string, arg bson.RawValue) (bson.RawValue, error) {
	switch op {
	case "$literal":
		return arg, nil
	case "$cond":
		var ifE, thenE, elseE bson.RawValue
		if d, ok := arg.DocumentOK(); ok {
			elems, _ := d.Elements()
			var seen int
			for _, el := range elems {
				switch el.Key() {
				case "if":
					ifE = el.Value()
				case "then":
					thenE = el.Value()
				case "else":
					elseE = el.Value()
				default:
					return valMissing, cmdErr(17083, "Unrecognized parameter to $cond: %s", el.Key())
				}
				seen++
			}
			switch {
			case ifE.Type == 0:
				return valMissing, cmdErr(17080, "Missing 'if' parameter to $cond")
			case thenE.Type == 0:
				return valMissing, cmdErr(17081, "Missing 'then' parameter to $cond")
			case elseE.Type == 0:
				return valMissing, cmdErr(17082, "Missing 'else' parameter to $cond")
			}
		} else {
			args := operands(arg)
			if err := arity(op, args, 3); err != nil {
				return valMissing, err
			}
			ifE, thenE, elseE = args[0], args[1], args[2]
		}
		c, err := evalExpression(env, ifE)
		if err != nil {
			return valMissing, err
		}
		if truthy(c) {
			return evalExpression(env, thenE)
		}
		return evalExpression(env, elseE)
	case "$ifNull":
		args := operands(arg)
		if len(args) < 2 {
			return valMissing, cmdErr(1257300, "$ifNull needs at least two arguments, had: %d", len(args))
		}
		for i, a := range args {
			v, err := evalExpression(env, a)
			if err != nil {
				return valMissing, err
			}
			if !nullish(v) || i == len(args)-1 {
				return v, nil
			}
		}
	case "$and", "$or":
		for _, a := range operands(arg) {
			v, err := evalExpression(env, a)
			if err != nil {
				return valMissing, err
			}
			if t := truthy(v); op == "$and" && !t {
				return valFalse, nil
			} else if op == "$or" && t {
				return valTrue, nil
			}
		}
		return boolVal(op == "$and"), nil
	case "$not":
		args := operands(arg)
		if err := arity(op, args, 1); err != nil {
			return valMissing, err
		}
		v, err := evalExpression(env, args[0])
		if err != nil {
			return valMissing, err
		}
		return boolVal(!truthy(v)), nil
	case "$eq", "$ne", "$lt", "$lte", "$gt", "$gte", "$cmp":
		args := operands(arg)
		if err := arity(op, args, 2); err != nil {
			return valMissing, err
		}
		vals, err := evalAll(env, args)
		if err != nil {
			return valMissing, err
		}
		c := exprCompare(vals[0], vals[1])
		switch op {
		case "$eq":
			return boolVal(c == 0), nil
		case "$ne":
			return boolVal(c != 0), nil
		case "$lt":
			return boolVal(c < 0), nil
		case "$lte":
			return boolVal(c <= 0), nil
		case "$gt":
			return boolVal(c > 0), nil
		case "$gte":
			return boolVal(c >= 0), nil
		}
		return int32Val(int32(max(-1, min(1, c)))), nil
	case "$max", "$min":
		args := operands(arg)
		vals, err := evalAll(env, args)
		if err != nil {
			return valMissing, err
		}
		if len(args) == 1 && vals[0].Type == bson.TypeArray {
			vals, _ = bson.Raw(vals[0].Value).Values()
		}
		best := valNull
		for _, v := range vals {
			if nullish(v) {
				continue
			}
			if best.Type == bson.TypeNull {
				best = v
				continue
			}
			if c := exprCompare(v, best); op == "$max" && c > 0 || op == "$min" && c < 0 {
				best = v
			}
		}
		return best, nil
	case "$add", "$multiply":
		vals, err := evalAll(env, operands(arg))
		if err != nil {
			return valMissing, err
		}
		if op == "$add" {
			return addValues(vals)
		}
		return multiplyValues(vals)
	case "$subtract":
		args := operands(arg)
		if err := arity(op, args, 2); err != nil {
			return valMissing, err
		}
		vals, err := evalAll(env, args)
		if err != nil {
			return valMissing, err
		}
		return subtractValues(vals[0], vals[1])
	case "$mod":
		args := operands(arg)
		if err := arity(op, args, 2); err != nil {
			return valMissing, err
		}
		vals, err := evalAll(env, args)
		if err != nil {
			return valMissing, err
		}
		return modValues(vals[0], vals[1])
	case "$abs", "$toLong", "$toHashedIndexKey":
		args := operands(arg)
		if err := arity(op, args, 1); err != nil {
			return valMissing, err
		}
		v, err := evalExpression(env, args[0])
		if err != nil {
			return valMissing, err
		}
		switch op {
		case "$abs":
			return absValue(v)
		case "$toLong":
			return toLong(v)
		}
		return int64Val(mhash.HashedIndexKey(v)), nil
	}
	return valMissing, cmdErr(codeInvalidPipelineOperator, "Unrecognized expression '%s' (mongowire evaluates field paths, $$NOW $$ROOT $$CURRENT $$REMOVE, $literal $cond $ifNull $eq $ne $lt $lte $gt $gte $cmp $and $or $not $add $subtract $multiply $mod $abs $toLong $max $min $toHashedIndexKey)", op)
}

// numKind ranks numeric types: the widest operand decides the result type.
func numKind(t bson.Type) int {
	switch t {
	case bson.TypeInt32:
		return 1
	case bson.TypeInt64:
		return 2
	case bson.TypeDouble:
		return 3
	case bson.TypeDecimal128:
		return 4
	}
	return 0
}

func asInt64(v bson.RawValue) int64 {
	switch v.Type {
	case bson.TypeInt32:
		return int64(v.Int32())
	case bson.TypeInt64:
		return v.Int64()
	case bson.TypeDateTime:
		return v.DateTime()
	}
	return int64(num(v))
}

func typeName(t bson.Type) string {
	switch t {
	case 0:
		return "missing"
	case bson.TypeEmbeddedDocument:
		return "object"
	case bson.TypeBoolean:
		return "bool"
	case bson.TypeDateTime:
		return "date"
	case bson.TypeInt32:
		return "int"
	case bson.TypeInt64:
		return "long"
	case bson.TypeDecimal128:
		return "decimal"
	}
	return t.String()
}

var errDecimalArith = cmdErr(codeBadValue, "mongowire does not implement decimal128 arithmetic in expressions")

// numResult returns an integer result in the narrowest type at least as
// wide as kind, or the double when the integer arithmetic overflowed.
func numResult(kind int, i int64, overflow bool, f float64) bson.RawValue {
	switch {
	case kind == 3 || overflow:
		return doubleVal(f)
	case kind == 2:
		return int64Val(i)
	}
	return intOrLong(i)
}

func addValues(vals []bson.RawValue) (bson.RawValue, error) {
	var (
		sum      int64
		fsum     float64
		kind     = 1
		overflow bool
		haveDate bool
	)
	for _, v := range vals {
		switch {
		case v.Type == bson.TypeDateTime:
			if haveDate {
				return valMissing, cmdErr(16612, "only one date allowed in an $add expression")
			}
			haveDate = true
		case numKind(v.Type) == 4:
			return valMissing, errDecimalArith
		case numKind(v.Type) > 0:
			kind = max(kind, numKind(v.Type))
		case nullish(v):
			return valNull, nil
		default:
			return valMissing, cmdErr(16554, "$add only supports numeric or date types, not %s", typeName(v.Type))
		}
		if v.Type != bson.TypeDouble {
			i := asInt64(v)
			s := sum + i
			if (i > 0 && s < sum) || (i < 0 && s > sum) {
				overflow = true
			}
			sum = s
			fsum += float64(i)
		} else {
			fsum += v.Double()
		}
	}
	if haveDate {
		if kind == 3 {
			if math.IsNaN(fsum) || fsum >= math.MaxInt64 || fsum < math.MinInt64 {
				return valMissing, cmdErr(15, "date overflow in $add")
			}
			return dateVal(int64(math.Round(fsum))), nil
		}
		if overflow {
			return valMissing, cmdErr(15, "date overflow in $add")
		}
		return dateVal(sum), nil
	}
	return numResult(kind, sum, overflow, fsum), nil
}

func multiplyValues(vals []bson.RawValue) (bson.RawValue, error) {
	var (
		prod     int64 = 1
		fprod          = 1.0
		kind           = 1
		overflow bool
	)
	for _, v := range vals {
		switch k := numKind(v.Type); {
		case k == 4:
			return valMissing, errDecimalArith
		case k > 0:
			kind = max(kind, k)
		case nullish(v):
			return valNull, nil
		default:
			return valMissing, cmdErr(16555, "$multiply only supports numeric types, not %s", typeName(v.Type))
		}
		if v.Type == bson.TypeDouble {
			fprod *= v.Double()
			continue
		}
		i := asInt64(v)
		if prod != 0 && i != 0 {
			p := prod * i
			if p/i != prod || (prod == -1 && i == math.MinInt64) || (i == -1 && prod == math.MinInt64) {
				overflow = true
			}
			prod = p
		} else {
			prod = 0
		}
		fprod *= float64(i)
	}
	return numResult(kind, prod, overflow, fprod), nil
}

func subtractValues(a, b bson.RawValue) (bson.RawValue, error) {
	if nullish(a) || nullish(b) {
		return valNull, nil
	}
	ka, kb := numKind(a.Type), numKind(b.Type)
	if ka == 4 || kb == 4 {
		return valMissing, errDecimalArith
	}
	switch {
	case ka > 0 && kb > 0:
		kind := max(ka, kb)
		if kind == 3 {
			return doubleVal(num(a) - num(b)), nil
		}
		x, y := asInt64(a), asInt64(b)
		d := x - y
		overflow := (y > 0 && d > x) || (y < 0 && d < x)
		return numResult(kind, d, overflow, float64(x)-float64(y)), nil
	case a.Type == bson.TypeDateTime && b.Type == bson.TypeDateTime:
		return int64Val(a.DateTime() - b.DateTime()), nil
	case a.Type == bson.TypeDateTime && kb > 0:
		if b.Type == bson.TypeDouble {
			return dateVal(a.DateTime() - int64(math.Round(b.Double()))), nil
		}
		return dateVal(a.DateTime() - asInt64(b)), nil
	}
	return valMissing, cmdErr(16556, "cant $subtract a %s from a %s", typeName(b.Type), typeName(a.Type))
}

func modValues(a, b bson.RawValue) (bson.RawValue, error) {
	if nullish(a) || nullish(b) {
		return valNull, nil
	}
	ka, kb := numKind(a.Type), numKind(b.Type)
	if ka == 0 || kb == 0 {
		t := a.Type
		if ka > 0 {
			t = b.Type
		}
		return valMissing, cmdErr(16611, "$mod only supports numeric types, not %s", typeName(t))
	}
	if ka == 4 || kb == 4 {
		return valMissing, errDecimalArith
	}
	if max(ka, kb) == 3 {
		if num(b) == 0 {
			return valMissing, cmdErr(16610, "can't $mod by zero")
		}
		return doubleVal(math.Mod(num(a), num(b))), nil
	}
	x, y := asInt64(a), asInt64(b)
	if y == 0 {
		return valMissing, cmdErr(16610, "can't $mod by zero")
	}
	var r int64
	if y != -1 { // MinInt64 % -1 overflows in C++; the result is 0
		r = x % y
	}
	if max(ka, kb) == 2 {
		return int64Val(r), nil
	}
	return int32Val(int32(r)), nil
}

func absValue(v bson.RawValue) (bson.RawValue, error) {
	switch v.Type {
	case 0, bson.TypeNull, bson.TypeUndefined:
		return valNull, nil
	case bson.TypeInt32:
		i := int64(v.Int32())
		if i < 0 {
			i = -i
		}
		return intOrLong(i), nil
	case bson.TypeInt64:
		i := v.Int64()
		if i == math.MinInt64 {
			return valMissing, cmdErr(28680, "can't take $abs of long long min")
		}
		if i < 0 {
			i = -i
		}
		return int64Val(i), nil
	case bson.TypeDouble:
		return doubleVal(math.Abs(v.Double())), nil
	case bson.TypeDecimal128:
		return valMissing, errDecimalArith
	}
	return valMissing, cmdErr(28765, "$abs only supports numeric types, not %s", typeName(v.Type))
}

func toLong(v bson.RawValue) (bson.RawValue, error) {
	fail := func() (bson.RawValue, error) {
		return valMissing, cmdErr(codeConversionFailure, "Failed to parse number '%s' in $convert with no onError value", v)
	}
	switch v.Type {
	case 0, bson.TypeNull, bson.TypeUndefined:
		return valNull, nil
	case bson.TypeBoolean:
		if v.Boolean() {
			return int64Val(1), nil
		}
		return int64Val(0), nil
	case bson.TypeInt32, bson.TypeInt64, bson.TypeDateTime:
		return int64Val(asInt64(v)), nil
	case bson.TypeDouble:
		f := v.Double()
		if math.IsNaN(f) || math.IsInf(f, 0) || f >= math.MaxInt64 || f < math.MinInt64 {
			return valMissing, cmdErr(codeConversionFailure, "Conversion would overflow target type in $convert with no onError value: %v", f)
		}
		return int64Val(int64(f)), nil
	case bson.TypeDecimal128:
		f, err := strconv.ParseFloat(v.Decimal128().String(), 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f >= math.MaxInt64 || f < math.MinInt64 {
			return valMissing, cmdErr(codeConversionFailure, "Conversion would overflow target type in $convert with no onError value: %s", v.Decimal128())
		}
		return int64Val(int64(f)), nil
	case bson.TypeString:
		i, err := strconv.ParseInt(v.StringValue(), 10, 64)
		if err != nil {
			return fail()
		}
		return int64Val(i), nil
	}
	return valMissing, cmdErr(codeConversionFailure, "Unsupported conversion from %s to long in $convert with no onError value", typeName(v.Type))
}
