package mql

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"math/big"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/changegate/changegate/internal/bsonraw"
	"github.com/changegate/changegate/query"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// UpdateOptions parameterises [ApplyUpdate].
type UpdateOptions struct {
	// Insert is true when the update creates the document through an
	// upsert: $setOnInsert is applied only then.
	Insert bool
	// Now is the time $currentDate writes; the zero value means time.Now().
	Now time.Time
}

// UpdateDescription mirrors the updateDescription of a MongoDB change
// stream update event for the update that produced it.
//
// UpdatedFields holds, in the order the paths were applied, each modified
// dotted path with its new value (bson.RawValue values). $set of "a.b"
// reports "a.b"; a path whose intermediate documents had to be created is
// reported at the first created field ("a" with the whole new
// subdocument), as MongoDB does. Array changes made by $push, $addToSet,
// $pop, $pull and $pullAll are reported like MongoDB 6+: appends as one
// "arr.N" entry per new element, removals from the end as a
// TruncatedArrays entry {field, newSize}, anything else (insertion at a
// position, $sort, removals elsewhere) as the whole array under "arr".
// RemovedFields lists paths removed by $unset and $rename. For a
// replacement the description compares top-level fields.
type UpdateDescription struct {
	UpdatedFields   bson.D
	RemovedFields   []string
	TruncatedArrays bson.A
}

// Empty reports whether the description records no change.
func (d *UpdateDescription) Empty() bool {
	return len(d.UpdatedFields) == 0 && len(d.RemovedFields) == 0 && len(d.TruncatedArrays) == 0
}

func emptyDescription() *UpdateDescription {
	return &UpdateDescription{UpdatedFields: bson.D{}, RemovedFields: []string{}, TruncatedArrays: bson.A{}}
}

// Error is an update or upsert error carrying the MongoDB server error
// code a server would reply with (for example 66 ImmutableField, 40
// ConflictingUpdateOperators, 14 TypeMismatch, 9 FailedToParse, 2
// BadValue). Its message is MongoDB's, which is why it is capitalised.
type Error struct {
	Code     int
	CodeName string
	Message  string
}

func (e *Error) Error() string { return e.Message }

func errf(code int, name, format string, args ...any) error {
	return &Error{Code: code, CodeName: name, Message: fmt.Sprintf(format, args...)}
}

const (
	codeBadValue       = 2
	codeFailedToParse  = 9
	codeTypeMismatch   = 14
	codePathNotViable  = 28
	codeConflicting    = 40
	codeEmptyFieldName = 56
	codeImmutableField = 66
	codeBSONObjTooBig  = 10334
	maxDocumentSize    = 16 * 1024 * 1024
)

// IsReplacement reports whether update is a replacement document, that is
// one without any top-level field starting with '$'. An empty document is
// a replacement.
func IsReplacement(update bson.Raw) bool {
	it := bsonraw.NewIter(update)
	for {
		k, _, _, ok := it.Next()
		if !ok {
			return true
		}
		if len(k) > 0 && k[0] == '$' {
			return false
		}
	}
}

type updateOp struct {
	op        string
	path      string
	parts     []string
	from      string // $rename source
	fromParts []string
	arg       bson.RawValue
}

var updateOperators = map[string]bool{
	"$set": true, "$unset": true, "$inc": true, "$mul": true, "$min": true, "$max": true,
	"$rename": true, "$push": true, "$addToSet": true, "$pop": true, "$pull": true,
	"$pullAll": true, "$setOnInsert": true, "$currentDate": true,
}

// ApplyUpdate applies an update document to doc and returns the new
// document and a description of the change.
//
// An update whose top-level keys start with '$' is an operator update:
// $set $unset $inc $mul $min $max $rename $push (with $each, $slice,
// $position, $sort) $addToSet (with $each) $pop $pull (a value, a
// condition on values such as {$gte: 6}, or a query on document
// elements) $pullAll $setOnInsert (only when opts.Insert) and
// $currentDate (true, {$type: "date"} or {$type: "timestamp"}). Paths are
// dotted; missing intermediate documents are created and numeric
// components index arrays (padding with nulls). Fields are processed in
// lexicographic path order, so new fields are appended in that order, as
// in MongoDB 5.0+. Positional operators ($, $[], $[id]) are not supported.
//
// Otherwise update is a replacement: the result is update with doc's _id
// (which the replacement may repeat but not change).
//
// An update that changes nothing returns doc itself and an empty
// description (callers report nModified 0). Errors are *[Error] values
// with MongoDB's codes and messages, e.g. "Performing an update on the
// path '_id' would modify the immutable field '_id'". doc may be empty (an
// upsert into nothing). Neither input is modified.
func ApplyUpdate(doc bson.Raw, update bson.Raw, opts UpdateOptions) (bson.Raw, *UpdateDescription, error) {
	if len(doc) == 0 {
		doc = bson.Raw{5, 0, 0, 0, 0}
	}
	if err := doc.Validate(); err != nil {
		return nil, nil, errf(codeBadValue, "BadValue", "invalid document: %v", err)
	}
	if err := update.Validate(); err != nil {
		return nil, nil, errf(codeFailedToParse, "FailedToParse", "invalid update document: %v", err)
	}
	if opts.Now.IsZero() {
		opts.Now = time.Now()
	}
	if IsReplacement(update) {
		return applyReplacement(doc, update)
	}
	ops, err := parseUpdate(update)
	if err != nil {
		return nil, nil, err
	}
	u := &updater{root: decodeValue(bson.TypeEmbeddedDocument, doc), opts: opts, doc: doc}
	for i := range ops {
		if err := u.apply(&ops[i]); err != nil {
			return nil, nil, err
		}
	}
	if len(u.changes) == 0 {
		return doc, emptyDescription(), nil
	}
	if t, v, ok := bsonraw.Lookup(doc, "_id"); ok {
		if nv, _ := u.root.field("_id"); nv == nil || !same(nv, decodeValue(t, v)) {
			return nil, nil, errf(codeImmutableField, "ImmutableField", "Performing an update on the path '_id' would modify the immutable field '_id'")
		}
	}
	out := bson.Raw(u.root.encode(make([]byte, 0, len(doc)+64)))
	if len(out) > maxDocumentSize {
		return nil, nil, errf(codeBSONObjTooBig, "BSONObjectTooLarge", "Resulting document after update is larger than %d", maxDocumentSize)
	}
	if bytes.Equal(out, doc) {
		return doc, emptyDescription(), nil
	}
	return out, u.describe(), nil
}

func applyReplacement(doc, repl bson.Raw) (bson.Raw, *UpdateDescription, error) {
	old := decodeValue(bson.TypeEmbeddedDocument, doc)
	nw := decodeValue(bson.TypeEmbeddedDocument, repl)
	if id, _ := old.field("_id"); id != nil {
		if nid, _ := nw.field("_id"); nid != nil {
			if !same(id, nid) {
				return nil, nil, errf(codeImmutableField, "ImmutableField",
					"After applying the update, the (immutable) field '_id' was found to have been altered to %s", elemString("_id", nid))
			}
		} else {
			nw.fields = append([]mfield{{key: "_id", v: id}}, nw.fields...)
		}
	}
	out := bson.Raw(nw.encode(nil))
	if len(out) > maxDocumentSize {
		return nil, nil, errf(codeBSONObjTooBig, "BSONObjectTooLarge", "Resulting document after update is larger than %d", maxDocumentSize)
	}
	if bytes.Equal(out, doc) {
		return doc, emptyDescription(), nil
	}
	d := emptyDescription()
	for _, f := range nw.fields {
		if ov, _ := old.field(f.key); ov == nil || !same(ov, f.v) {
			d.UpdatedFields = append(d.UpdatedFields, bson.E{Key: f.key, Value: f.v.rawValue()})
		}
	}
	for _, f := range old.fields {
		if nv, _ := nw.field(f.key); nv == nil {
			d.RemovedFields = append(d.RemovedFields, f.key)
		}
	}
	return out, d, nil
}

func parseUpdate(update bson.Raw) ([]updateOp, error) {
	var ops []updateOp
	it := bsonraw.NewIter(update)
	for {
		k, t, v, ok := it.Next()
		if !ok {
			break
		}
		op := string(k)
		if !updateOperators[op] {
			return nil, errf(codeFailedToParse, "FailedToParse", "Unknown modifier: %s. Expected a valid update modifier or pipeline-style update specified as an array", op)
		}
		if t != bson.TypeEmbeddedDocument {
			return nil, errf(codeFailedToParse, "FailedToParse", "Modifiers operate on fields but we found type %s instead. For example: {$mod: {<field>: ...}} not {%s: %s}", typeName(t), op, valueString(bsonraw.Value(t, v)))
		}
		fit := bsonraw.NewIter(v)
		for {
			fk, ft, fv, ok := fit.Next()
			if !ok {
				break
			}
			o := updateOp{op: op, path: string(fk), arg: bsonraw.Value(ft, fv)}
			if err := validateUpdatePath(o.path); err != nil {
				return nil, err
			}
			o.parts = strings.Split(o.path, ".")
			if op == "$rename" {
				if ft != bson.TypeString {
					return nil, errf(codeBadValue, "BadValue", "The 'to' field for $rename must be a string: %s", elemString(o.path, fromRaw(o.arg)))
				}
				o.from, o.fromParts = o.path, o.parts
				o.path = string(bsonraw.Str(fv))
				if err := validateUpdatePath(o.path); err != nil {
					return nil, err
				}
				o.parts = strings.Split(o.path, ".")
				if o.from == o.path {
					return nil, errf(codeBadValue, "BadValue", "The source and target field for $rename must differ: %s", elemString(o.from, fromRaw(o.arg)))
				}
				if isPrefix(o.fromParts, o.parts) || isPrefix(o.parts, o.fromParts) {
					return nil, errf(codeBadValue, "BadValue", "The source and target field for $rename must not be on the same path: %s", elemString(o.from, fromRaw(o.arg)))
				}
			}
			ops = append(ops, o)
		}
	}
	// Conflicting paths: one path equal to or a prefix of another.
	type seen struct {
		path  string
		parts []string
	}
	var paths []seen
	for _, o := range ops {
		cand := []seen{{o.path, o.parts}}
		if o.from != "" {
			cand = append([]seen{{o.from, o.fromParts}}, cand...)
		}
		for _, c := range cand {
			for _, p := range paths {
				if isPrefix(p.parts, c.parts) {
					return nil, errf(codeConflicting, "ConflictingUpdateOperators", "Updating the path '%s' would create a conflict at '%s'", c.path, p.path)
				}
				if isPrefix(c.parts, p.parts) {
					return nil, errf(codeConflicting, "ConflictingUpdateOperators", "Updating the path '%s' would create a conflict at '%s'", c.path, c.path)
				}
			}
			paths = append(paths, c)
		}
	}
	slices.SortStableFunc(ops, func(a, b updateOp) int { return comparePaths(a.parts, b.parts) })
	return ops, nil
}

func validateUpdatePath(path string) error {
	if path == "" {
		return errf(codeEmptyFieldName, "EmptyFieldName", "An empty update path is not valid.")
	}
	for _, p := range strings.Split(path, ".") {
		if p == "" {
			return errf(codeEmptyFieldName, "EmptyFieldName", "The update path '%s' contains an empty field name, which is not allowed.", path)
		}
		if p[0] == '$' {
			return errf(codeBadValue, "BadValue", "The update path '%s' contains a positional or $-prefixed field name '%s', which is not supported", path, p)
		}
	}
	return nil
}

// isPrefix reports whether a is a component-wise prefix of (or equal to) b.
func isPrefix(a, b []string) bool {
	return len(a) <= len(b) && slices.Equal(a, b[:len(a)])
}

// comparePaths orders update paths the way MongoDB 5.0+ applies them:
// component by component, numeric names numerically, others bytewise.
func comparePaths(a, b []string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		ai, bi := bsonraw.ArrayIndex(a[i]), bsonraw.ArrayIndex(b[i])
		if ai >= 0 && bi >= 0 {
			if c := cmp.Compare(ai, bi); c != 0 {
				return c
			}
			continue
		}
		if c := strings.Compare(a[i], b[i]); c != 0 {
			return c
		}
	}
	return cmp.Compare(len(a), len(b))
}

type changeKind int

const (
	chSet changeKind = iota
	chUnset
	chTruncate
)

type change struct {
	kind    changeKind
	path    string
	newSize int
}

type updater struct {
	root    *mval
	opts    UpdateOptions
	doc     bson.Raw
	changes []change
}

func (u *updater) record(kind changeKind, path string, n int) {
	u.changes = append(u.changes, change{kind: kind, path: path, newSize: n})
}

func (u *updater) describe() *UpdateDescription {
	d := emptyDescription()
	var setPaths []string
	for _, c := range u.changes {
		if c.kind == chSet {
			setPaths = append(setPaths, c.path)
		}
	}
	covered := func(p string) bool {
		for _, s := range setPaths {
			if s != p && strings.HasPrefix(p, s+".") {
				return true
			}
		}
		return false
	}
	done := map[string]bool{}
	for _, c := range u.changes {
		if done[c.path] || covered(c.path) {
			continue
		}
		done[c.path] = true
		switch c.kind {
		case chSet:
			if v := u.root.get(strings.Split(c.path, ".")); v != nil {
				d.UpdatedFields = append(d.UpdatedFields, bson.E{Key: c.path, Value: v.rawValue()})
			}
		case chUnset:
			d.RemovedFields = append(d.RemovedFields, c.path)
		case chTruncate:
			d.TruncatedArrays = append(d.TruncatedArrays, bson.D{{Key: "field", Value: c.path}, {Key: "newSize", Value: int32(c.newSize)}})
		}
	}
	return d
}

func (u *updater) idString() string {
	if t, v, ok := bsonraw.Lookup(u.doc, "_id"); ok {
		return elemString("_id", decodeValue(t, v))
	}
	return "{}"
}

// container returns the value holding the last path component, creating
// missing intermediate documents when create is set. createdAt is the
// index of the first component created, or -1.
func (u *updater) container(parts []string, create bool) (*mval, int, error) {
	cur, createdAt := u.root, -1
	for i, p := range parts[:len(parts)-1] {
		next := cur.child(p)
		if next == nil {
			if !create {
				return nil, -1, nil
			}
			next = newDoc()
			switch cur.t {
			case bson.TypeEmbeddedDocument:
				cur.fields = append(cur.fields, mfield{key: p, v: next})
			case bson.TypeArray:
				idx := bsonraw.ArrayIndex(p)
				if idx < 0 {
					return nil, -1, cannotCreate(p, parts[i-1], cur)
				}
				for len(cur.elems) <= idx {
					cur.elems = append(cur.elems, nullValue())
				}
				cur.elems[idx] = next
			default:
				return nil, -1, cannotCreate(p, parts[i-1], cur)
			}
			if createdAt < 0 {
				createdAt = i
			}
		}
		cur = next
	}
	return cur, createdAt, nil
}

func cannotCreate(field, parentKey string, parent *mval) error {
	return errf(codePathNotViable, "PathNotViable", "Cannot create field '%s' in element %s", field, elemString(parentKey, parent))
}

// set stores v at parts, recording the change unless the value is
// binary-identical to what is there.
func (u *updater) set(parts []string, v *mval) error {
	c, createdAt, err := u.container(parts, true)
	if err != nil {
		return err
	}
	last := parts[len(parts)-1]
	path := strings.Join(parts, ".")
	if createdAt >= 0 {
		path = strings.Join(parts[:createdAt+1], ".")
	}
	switch c.t {
	case bson.TypeEmbeddedDocument:
		if old, _ := c.field(last); old != nil && same(old, v) {
			return nil
		}
		c.setField(last, v)
	case bson.TypeArray:
		idx := bsonraw.ArrayIndex(last)
		if idx < 0 {
			return cannotCreate(last, parts[len(parts)-2], c)
		}
		if idx < len(c.elems) && same(c.elems[idx], v) {
			return nil
		}
		if idx >= len(c.elems) && idx > len(c.elems) && createdAt < 0 {
			// padding with nulls: report the whole array
			path = strings.Join(parts[:len(parts)-1], ".")
		}
		for len(c.elems) <= idx {
			c.elems = append(c.elems, nullValue())
		}
		c.elems[idx] = v
	default:
		key := "root"
		if len(parts) > 1 {
			key = parts[len(parts)-2]
		}
		return cannotCreate(last, key, c)
	}
	u.record(chSet, path, 0)
	return nil
}

func (u *updater) unset(parts []string) {
	c, _, _ := u.container(parts, false)
	if c == nil {
		return
	}
	last := parts[len(parts)-1]
	path := strings.Join(parts, ".")
	switch c.t {
	case bson.TypeEmbeddedDocument:
		if c.removeField(last) {
			u.record(chUnset, path, 0)
		}
	case bson.TypeArray:
		// $unset of an array element sets it to null.
		if idx := bsonraw.ArrayIndex(last); idx >= 0 && idx < len(c.elems) && c.elems[idx].t != bson.TypeNull {
			c.elems[idx] = nullValue()
			u.record(chSet, path, 0)
		}
	}
}

func (u *updater) apply(o *updateOp) error {
	switch o.op {
	case "$set":
		return u.set(o.parts, fromRaw(o.arg))
	case "$setOnInsert":
		if u.opts.Insert {
			return u.set(o.parts, fromRaw(o.arg))
		}
		return nil
	case "$unset":
		u.unset(o.parts)
		return nil
	case "$inc", "$mul":
		return u.arith(o)
	case "$min", "$max":
		cur := u.root.get(o.parts)
		if cur != nil {
			c := query.Compare(o.arg, cur.rawValue())
			if (o.op == "$min" && c >= 0) || (o.op == "$max" && c <= 0) {
				return nil
			}
		}
		return u.set(o.parts, fromRaw(o.arg))
	case "$currentDate":
		return u.currentDate(o)
	case "$rename":
		return u.rename(o)
	case "$push":
		return u.push(o)
	case "$addToSet":
		return u.addToSet(o)
	case "$pop":
		return u.pop(o)
	case "$pull", "$pullAll":
		return u.pull(o)
	}
	return nil
}

func (u *updater) arith(o *updateOp) error {
	verb := map[string]string{"$inc": "increment", "$mul": "multiply"}[o.op]
	if !bsonraw.IsNumeric(o.arg.Type) {
		return errf(codeTypeMismatch, "TypeMismatch", "Cannot %s with non-numeric argument: %s", verb, elemString(o.path, fromRaw(o.arg)))
	}
	cur := u.root.get(o.parts)
	if cur == nil {
		if o.op == "$inc" {
			return u.set(o.parts, fromRaw(o.arg))
		}
		zero, _ := arithmetic(true, o.arg, int32Value(0))
		return u.set(o.parts, fromRaw(zero))
	}
	if !bsonraw.IsNumeric(cur.t) {
		return errf(codeTypeMismatch, "TypeMismatch", "Cannot apply %s to a value of non-numeric type. %s has the field '%s' of non-numeric type %s", o.op, u.idString(), o.parts[len(o.parts)-1], typeName(cur.t))
	}
	res, err := arithmetic(o.op == "$mul", cur.rawValue(), o.arg)
	if err != nil {
		return errf(codeBadValue, "BadValue", "Failed to apply %s operations to current value (%s) for document %s: %v", o.op, valueString(cur.rawValue()), u.idString(), err)
	}
	return u.set(o.parts, fromRaw(res))
}

func (u *updater) currentDate(o *updateOp) error {
	kind := ""
	switch o.arg.Type {
	case bson.TypeBoolean:
		kind = "date"
	case bson.TypeEmbeddedDocument:
		t, v, ok := bsonraw.Lookup(o.arg.Value, "$type")
		if ok && t == bson.TypeString && bsonraw.CountElems(o.arg.Value) == 1 {
			kind = string(bsonraw.Str(v))
		}
	}
	var val bson.RawValue
	switch kind {
	case "date":
		val = bson.RawValue{Type: bson.TypeDateTime, Value: binary.LittleEndian.AppendUint64(nil, uint64(u.opts.Now.UnixMilli()))}
	case "timestamp":
		val = bson.RawValue{Type: bson.TypeTimestamp, Value: binary.LittleEndian.AppendUint64(nil, uint64(u.opts.Now.Unix())<<32|1)}
	default:
		return errf(codeBadValue, "BadValue", "%s is not valid type for $currentDate. Please use a boolean ('true') or a $type expression ({$type: 'timestamp/date'}).", typeName(o.arg.Type))
	}
	return u.set(o.parts, fromRaw(val))
}

func (u *updater) rename(o *updateOp) error {
	// Neither path may traverse an array.
	check := func(parts []string, what string) error {
		cur := u.root
		for _, p := range parts[:len(parts)-1] {
			if cur = cur.child(p); cur == nil {
				return nil
			}
			if cur.t == bson.TypeArray {
				return errf(codeBadValue, "BadValue", "The %s field cannot be an array element, '%s' in doc with %s", what, strings.Join(parts, "."), u.idString())
			}
		}
		return nil
	}
	if err := check(o.fromParts, "source"); err != nil {
		return err
	}
	src := u.root.get(o.fromParts)
	if src == nil {
		return nil
	}
	if err := check(o.parts, "destination"); err != nil {
		return err
	}
	u.unset(o.fromParts)
	return u.set(o.parts, src)
}

// arrayAt returns the array at o's path (nil when missing) or a
// TypeMismatch error when the field is not an array.
func (u *updater) arrayAt(o *updateOp) (*mval, error) {
	cur := u.root.get(o.parts)
	if cur != nil && cur.t != bson.TypeArray {
		switch o.op {
		case "$addToSet":
			return nil, errf(codeBadValue, "BadValue", "Cannot apply $addToSet to non-array field. Field named '%s' has non-array type %s", o.parts[len(o.parts)-1], typeName(cur.t))
		case "$pop":
			return nil, errf(codeTypeMismatch, "TypeMismatch", "Path '%s' contains an element of non-array type '%s'", o.path, typeName(cur.t))
		case "$pull", "$pullAll":
			return nil, errf(codeBadValue, "BadValue", "Cannot apply %s to a non-array value", o.op)
		}
		return nil, errf(codeBadValue, "BadValue", "The field '%s' must be an array but is of type %s in document %s", o.path, typeName(cur.t), u.idString())
	}
	return cur, nil
}

// setArray replaces the elements of the array at o's path (creating the
// field when arr is nil) and records the change the way change streams
// report it.
func (u *updater) setArray(o *updateOp, arr *mval, elems []*mval) error {
	if arr == nil {
		n := newArray()
		n.elems = elems
		return u.set(o.parts, n)
	}
	old := arr.elems
	p := 0
	for p < len(old) && p < len(elems) && same(old[p], elems[p]) {
		p++
	}
	arr.elems = elems
	switch {
	case p == len(old) && p == len(elems):
	case p == len(old):
		for i := p; i < len(elems); i++ {
			u.record(chSet, o.path+"."+strconv.Itoa(i), 0)
		}
	case p == len(elems):
		u.record(chTruncate, o.path, len(elems))
	default:
		u.record(chSet, o.path, 0)
	}
	return nil
}

func eachArg(o *updateOp) ([]*mval, bson.Raw, error) {
	if o.arg.Type == bson.TypeEmbeddedDocument {
		if k, t, v := bsonraw.FirstElem(o.arg.Value); string(k) == "$each" {
			if t != bson.TypeArray {
				return nil, nil, errf(codeBadValue, "BadValue", "The argument to $each in %s must be an array but it was of type: %s", o.op, typeName(t))
			}
			return decodeValue(t, v).elems, o.arg.Value, nil
		}
	}
	return []*mval{fromRaw(o.arg)}, nil, nil
}

func (u *updater) push(o *updateOp) error {
	vals, mods, err := eachArg(o)
	if err != nil {
		return err
	}
	position, slice, hasPosition, hasSlice := 0, 0, false, false
	var sortFn func(a, b *mval) int
	if mods != nil {
		it := bsonraw.NewIter(mods)
		for {
			k, t, v, ok := it.Next()
			if !ok {
				break
			}
			switch string(k) {
			case "$each":
			case "$slice", "$position":
				n, ok := wholeNumber(t, v)
				if !ok {
					return errf(codeBadValue, "BadValue", "The value for %s must be an integer value but was given type: %s", k, typeName(t))
				}
				if string(k) == "$slice" {
					slice, hasSlice = n, true
				} else {
					position, hasPosition = n, true
				}
			case "$sort":
				if sortFn, err = pushSort(t, v); err != nil {
					return err
				}
			default:
				return errf(codeBadValue, "BadValue", "Unrecognized clause in $push: %s", k)
			}
		}
	}
	arr, err := u.arrayAt(o)
	if err != nil {
		return err
	}
	var elems []*mval
	if arr != nil {
		elems = slices.Clone(arr.elems)
	}
	at := len(elems)
	if hasPosition {
		if position < 0 {
			at = max(len(elems)+position, 0)
		} else {
			at = min(position, len(elems))
		}
	}
	elems = slices.Insert(elems, at, vals...)
	if sortFn != nil {
		slices.SortStableFunc(elems, sortFn)
	}
	if hasSlice {
		switch {
		case slice >= 0 && slice < len(elems):
			elems = elems[:slice]
		case slice < 0 && -slice < len(elems):
			elems = elems[len(elems)+slice:]
		}
	}
	if elems == nil {
		elems = []*mval{}
	}
	return u.setArray(o, arr, elems)
}

func wholeNumber(t bson.Type, v []byte) (int, bool) {
	if !bsonraw.IsNumeric(t) {
		return 0, false
	}
	f := bsonraw.ToFloat(t, v)
	if f != math.Trunc(f) || math.IsInf(f, 0) {
		return 0, false
	}
	return int(f), true
}

func pushSort(t bson.Type, v []byte) (func(a, b *mval) int, error) {
	if bsonraw.IsNumeric(t) {
		switch bsonraw.ToFloat(t, v) {
		case 1:
			return func(a, b *mval) int { return query.Compare(a.rawValue(), b.rawValue()) }, nil
		case -1:
			return func(a, b *mval) int { return query.Compare(b.rawValue(), a.rawValue()) }, nil
		}
	}
	if t == bson.TypeEmbeddedDocument {
		s, err := CompileSort(v)
		if err != nil || len(s.keys) == 0 {
			return nil, errf(codeBadValue, "BadValue", "The $sort is invalid: use 1/-1 to sort the whole element, or {field:1/-1} to sort embedded fields")
		}
		return func(a, b *mval) int {
			return s.Compare(docBytes(a), docBytes(b))
		}, nil
	}
	return nil, errf(codeBadValue, "BadValue", "The $sort is invalid: use 1/-1 to sort the whole element, or {field:1/-1} to sort embedded fields")
}

// docBytes encodes a document value; non-documents become an empty
// document, so that every sort field is missing for them.
func docBytes(m *mval) []byte {
	if m.t != bson.TypeEmbeddedDocument {
		return []byte{5, 0, 0, 0, 0}
	}
	return m.encode(nil)
}

func (u *updater) addToSet(o *updateOp) error {
	vals, _, err := eachArg(o)
	if err != nil {
		return err
	}
	arr, err := u.arrayAt(o)
	if err != nil {
		return err
	}
	var elems []*mval
	if arr != nil {
		elems = slices.Clone(arr.elems)
	}
	for _, v := range vals {
		rv := v.rawValue()
		if !slices.ContainsFunc(elems, func(e *mval) bool { return query.Equal(e.rawValue(), rv) }) {
			elems = append(elems, v)
		}
	}
	if elems == nil {
		elems = []*mval{}
	}
	return u.setArray(o, arr, elems)
}

func (u *updater) pop(o *updateOp) error {
	n, ok := wholeNumber(o.arg.Type, o.arg.Value)
	if !ok || (n != 1 && n != -1) {
		return errf(codeFailedToParse, "FailedToParse", "$pop expects 1 or -1, found: %s", valueString(o.arg))
	}
	arr, err := u.arrayAt(o)
	if err != nil || arr == nil || len(arr.elems) == 0 {
		return err
	}
	if n == 1 {
		return u.setArray(o, arr, slices.Clone(arr.elems[:len(arr.elems)-1]))
	}
	return u.setArray(o, arr, slices.Clone(arr.elems[1:]))
}

func (u *updater) pull(o *updateOp) error {
	var match func(e *mval) bool
	switch {
	case o.op == "$pullAll":
		if o.arg.Type != bson.TypeArray {
			return errf(codeBadValue, "BadValue", "$pullAll requires an array argument but was given a %s", typeName(o.arg.Type))
		}
		vals := decodeValue(o.arg.Type, o.arg.Value).elems
		match = func(e *mval) bool {
			rv := e.rawValue()
			return slices.ContainsFunc(vals, func(v *mval) bool { return query.Equal(v.rawValue(), rv) })
		}
	case o.arg.Type == bson.TypeRegex || (o.arg.Type == bson.TypeEmbeddedDocument && query.IsCondition(o.arg.Value)):
		c, err := query.CompileCondition(o.path, o.arg)
		if err != nil {
			return errf(codeBadValue, "BadValue", "%v", err)
		}
		match = func(e *mval) bool { return c.Match(e.rawValue()) }
	case o.arg.Type == bson.TypeEmbeddedDocument:
		f, err := query.Compile(o.arg.Value)
		if err != nil {
			return errf(codeBadValue, "BadValue", "%v", err)
		}
		match = func(e *mval) bool { return e.t == bson.TypeEmbeddedDocument && f.Match(e.encode(nil)) }
	default:
		match = func(e *mval) bool { return query.Equal(e.rawValue(), o.arg) }
	}
	arr, err := u.arrayAt(o)
	if err != nil || arr == nil {
		return err
	}
	elems := []*mval{}
	for _, e := range arr.elems {
		if !match(e) {
			elems = append(elems, e)
		}
	}
	return u.setArray(o, arr, elems)
}

// ---- arithmetic ----

func int32Value(i int32) bson.RawValue {
	return bson.RawValue{Type: bson.TypeInt32, Value: binary.LittleEndian.AppendUint32(nil, uint32(i))}
}

func int64Value(i int64) bson.RawValue {
	return bson.RawValue{Type: bson.TypeInt64, Value: binary.LittleEndian.AppendUint64(nil, uint64(i))}
}

func doubleValue(f float64) bson.RawValue {
	return bson.RawValue{Type: bson.TypeDouble, Value: binary.LittleEndian.AppendUint64(nil, math.Float64bits(f))}
}

func decimalValue(d bson.Decimal128) bson.RawValue {
	h, l := d.GetBytes()
	b := binary.LittleEndian.AppendUint64(nil, l)
	return bson.RawValue{Type: bson.TypeDecimal128, Value: binary.LittleEndian.AppendUint64(b, h)}
}

// arithmetic adds (or multiplies) two numbers with MongoDB's type
// promotion: int32 op int32 is int32 unless it overflows into int64; int64
// overflow is an error; a double operand gives a double; a decimal operand
// gives a decimal.
func arithmetic(mul bool, a, b bson.RawValue) (bson.RawValue, error) {
	switch {
	case a.Type == bson.TypeDecimal128 || b.Type == bson.TypeDecimal128:
		return decimalArith(mul, a, b)
	case a.Type == bson.TypeDouble || b.Type == bson.TypeDouble:
		x, y := bsonraw.ToFloat(a.Type, a.Value), bsonraw.ToFloat(b.Type, b.Value)
		if mul {
			return doubleValue(x * y), nil
		}
		return doubleValue(x + y), nil
	}
	x, y := bsonraw.ReadInt(a.Type, a.Value), bsonraw.ReadInt(b.Type, b.Value)
	var r int64
	if mul {
		hi, lo := bits.Mul64(uint64(absI64(x)), uint64(absI64(y)))
		neg := (x < 0) != (y < 0)
		if hi != 0 || (lo > math.MaxInt64 && !(neg && lo == 1<<63)) {
			return bson.RawValue{}, fmt.Errorf("integer overflow")
		}
		r = int64(lo)
		if neg {
			r = -r
		}
	} else {
		r = x + y
		if (x > 0 && y > 0 && r < 0) || (x < 0 && y < 0 && r >= 0) {
			return bson.RawValue{}, fmt.Errorf("integer overflow")
		}
	}
	if a.Type == bson.TypeInt32 && b.Type == bson.TypeInt32 && r >= math.MinInt32 && r <= math.MaxInt32 {
		return int32Value(int32(r)), nil
	}
	return int64Value(r), nil
}

func absI64(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// toDecimalParts converts a number to coefficient and exponent; doubles
// are converted with 15 significant digits as MongoDB does.
func toDecimalParts(v bson.RawValue) (*big.Int, int, error) {
	switch v.Type {
	case bson.TypeInt32, bson.TypeInt64:
		return big.NewInt(bsonraw.ReadInt(v.Type, v.Value)), 0, nil
	case bson.TypeDouble:
		f := bsonraw.ReadDouble(v.Value)
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, 0, fmt.Errorf("non-finite operand")
		}
		d, err := bson.ParseDecimal128(strconv.FormatFloat(f, 'g', 15, 64))
		if err != nil {
			return nil, 0, err
		}
		return d.BigInt()
	default:
		return bsonraw.ReadDecimal(v.Value).BigInt()
	}
}

func decimalArith(mul bool, a, b bson.RawValue) (bson.RawValue, error) {
	ac, ae, err := toDecimalParts(a)
	if err != nil {
		return bson.RawValue{}, err
	}
	bc, be, err := toDecimalParts(b)
	if err != nil {
		return bson.RawValue{}, err
	}
	var c *big.Int
	var e int
	if mul {
		c, e = new(big.Int).Mul(ac, bc), ae+be
	} else {
		e = min(ae, be)
		ten := big.NewInt(10)
		as := new(big.Int).Mul(ac, new(big.Int).Exp(ten, big.NewInt(int64(ae-e)), nil))
		bs := new(big.Int).Mul(bc, new(big.Int).Exp(ten, big.NewInt(int64(be-e)), nil))
		c = as.Add(as, bs)
	}
	d, ok := bson.ParseDecimal128FromBigInt(c, e)
	if !ok {
		// Round to 34 significant digits.
		s := c.String()
		neg := strings.HasPrefix(s, "-")
		s = strings.TrimPrefix(s, "-")
		if len(s) > 34 {
			e += len(s) - 34
			s = s[:34]
		}
		c2, _ := new(big.Int).SetString(s, 10)
		if neg {
			c2.Neg(c2)
		}
		if d, ok = bson.ParseDecimal128FromBigInt(c2, e); !ok {
			return bson.RawValue{}, fmt.Errorf("decimal overflow")
		}
	}
	return decimalValue(d), nil
}

// ---- rendering for error messages ----

func typeName(t bson.Type) string {
	if n, ok := bsonraw.AliasOf(t); ok {
		return n
	}
	return fmt.Sprintf("type %d", byte(t))
}

func elemString(key string, v *mval) string {
	out, err := bson.MarshalExtJSON(bson.D{{Key: key, Value: v.rawValue()}}, false, false)
	if err != nil {
		return "{" + key + ": ?}"
	}
	return string(out)
}

func valueString(v bson.RawValue) string {
	s := elemString("v", fromRaw(v))
	s = strings.TrimPrefix(s, `{"v":`)
	return strings.TrimSuffix(s, "}")
}
