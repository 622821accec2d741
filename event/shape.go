package event

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/changegate/changegate/internal/bsonraw"
)

// This file shapes what a receiver gets (issue 17): a projection of the
// document (MongoDB projection semantics), redaction, the envelope form and
// the update description options. A shape is compiled once from a rule's
// and a sink's configuration; Event.Shaped applies it to an event after
// routing (filters always see the raw change) and returns a view of the
// event whose Envelope is the shaped payload. The view keeps the event's
// id: shaping never changes it.

// Form is the envelope form a receiver gets.
type Form uint8

// Envelope forms, from the most to the least content: a stricter shape has
// a larger Form.
const (
	// FormFull is today's envelope: id, source, operationType, ns,
	// documentKey, fullDocument, fullDocumentBeforeChange,
	// updateDescription, clusterTime, wallTime, rules.
	FormFull Form = iota
	// FormDocument is the post-image alone as the payload body (JSON null
	// when the change has none); the metadata (id, operation, namespace,
	// key, cluster time) travels beside it: webhook headers, SQS message
	// attributes, or in the EventBridge detail (see Event.Record).
	FormDocument
	// FormKey is {"id", "operationType", "ns", "documentKey"} only (and
	// "txn" for an event of a transaction).
	FormKey
)

// Forms lists the envelope forms by name, as configured.
var Forms = map[string]Form{"full": FormFull, "document": FormDocument, "key": FormKey}

// String returns the form's configuration name.
func (f Form) String() string {
	switch f {
	case FormDocument:
		return "document"
	case FormKey:
		return "key"
	}
	return "full"
}

// RedactMask is the value that replaces a redacted value in "mask" mode.
const RedactMask = "[REDACTED]"

// ShapePrefix is the first segment of every fields and redact path: the
// paths name fields of the document, which the shape applies to wherever
// the document appears (fullDocument, fullDocumentBeforeChange,
// updateDescription.updatedFields, removedFields, truncatedArrays).
const ShapePrefix = "fullDocument"

// MaxShapePathSegments bounds the segments of a fields or redact path.
const MaxShapePathSegments = 60

// Field is one entry of a projection: a dotted path that starts with
// "fullDocument." and whether it is included (1) or excluded (0).
type Field struct {
	Path    string
	Include bool
}

// ShapeSpec is a shape as configured on a rule or a sink. The zero value
// is the identity (the full envelope, unchanged).
type ShapeSpec struct {
	// Fields is a MongoDB projection of the document: all inclusions or
	// all exclusions, except that fullDocument._id may be excluded from an
	// inclusion (it is included by default, as in MongoDB).
	Fields []Field
	// Redact are paths ("fullDocument.ssn", "fullDocument.**.password")
	// whose values are replaced; "**" matches any number of fields.
	Redact []string
	// RedactHash replaces redacted values by the hex HMAC-SHA256 of the
	// value under RedactKey instead of RedactMask.
	RedactHash bool
	// RedactKey is the HMAC key of RedactHash (a secret: never logged).
	RedactKey []byte
	// Envelope is the envelope form (default FormFull).
	Envelope Form
	// DropUpdateDescription leaves updateDescription out
	// (include_update_description = false).
	DropUpdateDescription bool
	// SkipEmptyUpdates does not send an update whose projected
	// updateDescription is empty; the event is acknowledged all the same.
	SkipEmptyUpdates bool
	// MaxUpdatedFieldsBytes, when > 0, replaces updatedFields by
	// {"truncated": true} when its shaped BSON is larger.
	MaxUpdatedFieldsBytes int
}

// pattern is one compiled path: its segments after "fullDocument".
type pattern []string

// redaction is one redact path and how it replaces values.
type redaction struct {
	pat  int // in Shape.pats
	hash bool
	key  []byte
}

// Shape is a compiled, immutable shape; nil is the identity. It is safe for
// concurrent use.
type Shape struct {
	pats    []pattern
	incSets [][]int // each an inclusion (indexes into pats): a value must be kept by every set
	// dotted marks the patterns (exclusions and redactions) that read a
	// field name with dots ("card.number", allowed since MongoDB 5.0) as
	// the path it spells as well: such a field is redacted or excluded as
	// card.number is. Inclusions match real nested fields only, so a
	// dotted field is left out by an inclusion unless its parent is included.
	dotted []bool
	exc    []int
	red    []redaction
	form   Form
	dropUD bool
	skip   bool
	maxUF  int
	fp     string
}

// Fingerprint identifies the shape's effect: two shapes with the same
// fingerprint shape every event identically. It never contains a key
// (a redaction key appears as a hash of it). The identity's is "".
func (s *Shape) Fingerprint() string {
	if s == nil {
		return ""
	}
	return s.fp
}

// Form returns the envelope form (FormFull for nil).
func (s *Shape) Form() Form {
	if s == nil {
		return FormFull
	}
	return s.form
}

// ParseShapePath checks a fields or redact path and returns its segments
// after "fullDocument"; wild allows "**" segments (redact). The error
// says what is wrong, for a configuration message.
func ParseShapePath(path string, wild bool) ([]string, error) {
	segs := strings.Split(path, ".")
	if segs[0] != ShapePrefix || len(segs) < 2 {
		return nil, fmt.Errorf("path %q must start with %q and name a field of the document (it applies to fullDocument, fullDocumentBeforeChange and updateDescription alike)", path, ShapePrefix+".")
	}
	segs = segs[1:]
	if len(segs) > MaxShapePathSegments {
		return nil, fmt.Errorf("path %q has more than %d fields", path, MaxShapePathSegments)
	}
	for _, s := range segs {
		switch {
		case s == "":
			return nil, fmt.Errorf("path %q has an empty field name", path)
		case strings.HasPrefix(s, "$"):
			return nil, fmt.Errorf("path %q: field names starting with \"$\" cannot be used here", path)
		case s == "**" && !wild:
			return nil, fmt.Errorf("path %q: \"**\" is allowed in redact paths only", path)
		case s != "**" && strings.Contains(s, "*"):
			return nil, fmt.Errorf("path %q: a wildcard must be a whole field name, \"**\" (any number of fields)", path)
		}
	}
	return segs, nil
}

// CompileShape compiles spec; it returns nil (the identity) for a spec that
// changes nothing.
func CompileShape(spec ShapeSpec) (*Shape, error) {
	s := &Shape{form: spec.Envelope, dropUD: spec.DropUpdateDescription, skip: spec.SkipEmptyUpdates, maxUF: spec.MaxUpdatedFieldsBytes}
	if spec.Envelope > FormKey {
		return nil, fmt.Errorf("unknown envelope form %d", spec.Envelope)
	}
	if spec.MaxUpdatedFieldsBytes < 0 {
		return nil, errors.New("max_updated_fields_bytes must not be negative")
	}
	var inc []int
	mode := 0 // 1 inclusion, -1 exclusion
	idOnly := false
	for _, f := range spec.Fields {
		segs, err := ParseShapePath(f.Path, false)
		if err != nil {
			return nil, err
		}
		isID := len(segs) == 1 && segs[0] == "_id"
		switch {
		case isID && !f.Include:
			s.exc = append(s.exc, len(s.pats))
		case isID:
			idOnly = true // included by default; alone, an inclusion of _id only
			continue
		case f.Include && mode < 0, !f.Include && mode > 0:
			return nil, fmt.Errorf("fields mixes inclusion and exclusion (%q); only fullDocument._id may be excluded from an inclusion", f.Path)
		case f.Include:
			mode = 1
			inc = append(inc, len(s.pats))
		default:
			mode = -1
			s.exc = append(s.exc, len(s.pats))
		}
		s.pats = append(s.pats, segs)
	}
	if mode == 0 && idOnly {
		mode = 1 // { _id: 1 } alone keeps _id only, as in MongoDB
	}
	if mode > 0 {
		// _id is kept by an inclusion unless excluded, as in MongoDB.
		inc = append(inc, len(s.pats))
		s.pats = append(s.pats, pattern{"_id"})
		s.incSets = [][]int{inc}
	}
	if spec.RedactHash && len(spec.Redact) > 0 && len(spec.RedactKey) == 0 {
		return nil, errors.New(`redact_mode "hash" needs a key`)
	}
	for _, p := range spec.Redact {
		segs, err := ParseShapePath(p, true)
		if err != nil {
			return nil, err
		}
		r := redaction{pat: len(s.pats), hash: spec.RedactHash}
		if r.hash {
			r.key = slices.Clone(spec.RedactKey)
		}
		s.red = append(s.red, r)
		s.pats = append(s.pats, segs)
	}
	if s.identity() {
		return nil, nil
	}
	s.markDotted()
	s.fp = s.fingerprint()
	return s, nil
}

// markDotted sets dotted: every pattern but the inclusions'.
func (s *Shape) markDotted() {
	s.dotted = make([]bool, len(s.pats))
	for i := range s.dotted {
		s.dotted[i] = true
	}
	for _, set := range s.incSets {
		for _, i := range set {
			s.dotted[i] = false
		}
	}
}

func (s *Shape) identity() bool {
	return len(s.pats) == 0 && s.form == FormFull && !s.dropUD && !s.skip && s.maxUF == 0
}

// touchesChange reports whether the shape changes the change document
// itself (not only its form or whether it is sent).
func (s *Shape) touchesChange() bool {
	return len(s.pats) > 0 || s.dropUD || s.maxUF > 0
}

// Stricter returns the shape that applies both a and b, each in full: the
// intersection of their inclusions (a value is kept only if both keep it),
// the union of their exclusions and redactions (a value redacted by both
// is masked if either masks it), the smaller envelope form (key < document
// < full), the update description only if both include it, skipping
// empty updates if either does, and the smaller max_updated_fields_bytes.
// nil stands for the identity.
func Stricter(a, b *Shape) *Shape {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	case a.fp == b.fp:
		return a
	}
	s := &Shape{form: max(a.form, b.form), dropUD: a.dropUD || b.dropUD, skip: a.skip || b.skip, maxUF: a.maxUF}
	if b.maxUF > 0 && (s.maxUF == 0 || b.maxUF < s.maxUF) {
		s.maxUF = b.maxUF
	}
	s.pats = append(append(s.pats, a.pats...), b.pats...)
	off := len(a.pats)
	shift := func(idx []int) []int {
		out := make([]int, len(idx))
		for i, x := range idx {
			out[i] = x + off
		}
		return out
	}
	s.incSets = append(s.incSets, a.incSets...)
	for _, set := range b.incSets {
		s.incSets = append(s.incSets, shift(set))
	}
	s.exc = append(append(s.exc, a.exc...), shift(b.exc)...)
	s.red = append(s.red, a.red...)
	for _, r := range b.red {
		r.pat += off
		s.red = append(s.red, r)
	}
	s.markDotted()
	s.fp = s.fingerprint()
	return s
}

// fingerprint describes the shape canonically: sets sorted and without
// duplicates, redaction keys hashed.
func (s *Shape) fingerprint() string {
	path := func(i int) string { return strings.Join(s.pats[i], ".") }
	var sets []string
	for _, set := range s.incSets {
		var ps []string
		for _, i := range set {
			ps = append(ps, path(i))
		}
		slices.Sort(ps)
		sets = append(sets, strings.Join(slices.Compact(ps), ","))
	}
	slices.Sort(sets)
	var exc []string
	for _, i := range s.exc {
		exc = append(exc, path(i))
	}
	slices.Sort(exc)
	var red []string
	for _, r := range s.red {
		mode := "mask"
		if r.hash {
			sum := sha256.Sum256(append([]byte("changegate redact key\x00"), r.key...))
			mode = "hash:" + hex.EncodeToString(sum[:8])
		}
		red = append(red, path(r.pat)+"="+mode)
	}
	slices.Sort(red)
	return fmt.Sprintf("inc[%s] exc[%s] red[%s] form=%s dropUD=%t skip=%t maxUF=%d",
		strings.Join(slices.Compact(sets), "|"), strings.Join(slices.Compact(exc), ","), strings.Join(slices.Compact(red), ","),
		s.form, s.dropUD, s.skip, s.maxUF)
}

// --- path matching ---------------------------------------------------------

// A pattern's match state is a bit set of positions in the pattern: bit i
// means segments [0, i) are matched; bit len means the whole pattern is
// matched, which is sticky (everything below a matched path is matched).

func (p pattern) closure(b uint64) uint64 {
	for i, seg := range p {
		if b&(1<<uint(i)) != 0 && seg == "**" {
			b |= 1 << uint(i+1)
		}
	}
	return b
}

func (p pattern) start() uint64 { return p.closure(1) }

func (p pattern) step(b uint64, seg string) uint64 {
	end := uint64(1) << uint(len(p))
	n := b & end
	for i, ps := range p {
		if b&(1<<uint(i)) == 0 {
			continue
		}
		switch ps {
		case "**":
			n |= 1 << uint(i)
		case seg:
			n |= 1 << uint(i+1)
		}
	}
	return p.closure(n)
}

func (p pattern) matched(b uint64) bool { return b&(1<<uint(len(p))) != 0 }

// state is the match state of every pattern of a shape at one path.
type state []uint64

func (s *Shape) root() state {
	st := make(state, len(s.pats))
	for i, p := range s.pats {
		st[i] = p.start()
	}
	return st
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// verdict is what the shape does with the value at one path.
type verdict uint8

const (
	vKeep    verdict = iota // copy the value as is
	vDrop                   // leave the field out
	vRedact                 // replace the value (redactWith)
	vDescend                // shape the value's fields; scalars are kept
	vPartial                // shape the value's fields; scalars are dropped (inclusion not reached yet)
)

func (s *Shape) judge(st state) (verdict, *redaction) {
	for _, i := range s.exc {
		if s.pats[i].matched(st[i]) {
			return vDrop, nil
		}
	}
	allIncluded := true
	for _, set := range s.incSets {
		included, live := false, false
		for _, i := range set {
			if s.pats[i].matched(st[i]) {
				included = true
				break
			}
			if st[i] != 0 {
				live = true
			}
		}
		if !included {
			if !live {
				return vDrop, nil
			}
			allIncluded = false
		}
	}
	var hashed *redaction
	for k := range s.red {
		r := &s.red[k]
		if s.pats[r.pat].matched(st[r.pat]) {
			if !r.hash {
				return vRedact, r // a mask wins over a hash
			}
			if hashed == nil {
				hashed = r
			}
		}
	}
	if hashed != nil {
		return vRedact, hashed
	}
	if !allIncluded {
		return vPartial, nil
	}
	for _, i := range s.exc {
		if st[i] != 0 {
			return vDescend, nil
		}
	}
	for _, r := range s.red {
		if st[r.pat] != 0 {
			return vDescend, nil
		}
	}
	return vKeep, nil
}

// --- applying a shape to BSON ----------------------------------------------

var errMalformed = errors.New("shape: malformed BSON")

// walk applies a shape to one document tree, reusing one state buffer per
// depth (siblings are shaped one after the other).
type walk struct {
	s    *Shape
	bufs []state
}

// child returns the state one field (key) below st, in the buffer of depth.
func (w *walk) child(st state, key []byte, depth int) state {
	for len(w.bufs) <= depth {
		w.bufs = append(w.bufs, make(state, len(w.s.pats)))
	}
	out := w.bufs[depth]
	dots := bytes.IndexByte(key, '.') >= 0
	for i, p := range w.s.pats {
		if dots && w.s.dotted[i] {
			// A literal dotted field name: the state after the path it
			// spells, and after the whole name as one field (which only
			// "**" can match).
			n, rest := st[i], key
			for n != 0 {
				seg, tail, more := bytes.Cut(rest, dot)
				n = p.stepBytes(n, seg)
				if !more {
					break
				}
				rest = tail
			}
			out[i] = n | p.stepBytes(st[i], key)
			continue
		}
		out[i] = p.stepBytes(st[i], key)
	}
	return out
}

var dot = []byte{'.'}

// stepBytes is step with the field name as bytes.
func (p pattern) stepBytes(b uint64, seg []byte) uint64 {
	end := uint64(1) << uint(len(p))
	n := b & end
	for i, ps := range p {
		if b&(1<<uint(i)) == 0 {
			continue
		}
		switch {
		case ps == "**":
			n |= 1 << uint(i)
		case ps == string(seg):
			n |= 1 << uint(i+1)
		}
	}
	return p.closure(n)
}

// appendHeader appends an element header with a key given as bytes.
func appendHeader(dst []byte, t bsoncore.Type, key []byte) []byte {
	dst = append(dst, byte(t))
	dst = append(dst, key...)
	return append(dst, 0)
}

// arrayKeys are the keys of the first array elements.
var arrayKeys = func() (ks [128]string) {
	for i := range ks {
		ks[i] = strconv.Itoa(i)
	}
	return ks
}()

func arrayKey(i int) string {
	if i < len(arrayKeys) {
		return arrayKeys[i]
	}
	return strconv.Itoa(i)
}

// appendValue appends the element key: value shaped at state st, or
// nothing when the shape drops it. depth is the depth of the value (its
// fields' states use the buffer of depth+1).
func (w *walk) appendValue(dst []byte, key []byte, t bsoncore.Type, data []byte, st state, depth int) ([]byte, error) {
	v, r := w.s.judge(st)
	switch v {
	case vDrop:
		return dst, nil
	case vKeep:
		return append(appendHeader(dst, t, key), data...), nil
	case vRedact:
		return r.appendRedacted(dst, string(key), t, data)
	}
	switch t {
	case bsoncore.TypeEmbeddedDocument:
		return w.appendDoc(appendHeader(dst, t, key), data, st, depth+1)
	case bsoncore.TypeArray:
		return w.appendArray(appendHeader(dst, t, key), data, st, v == vPartial, depth+1)
	}
	if v == vPartial {
		return dst, nil
	}
	return append(appendHeader(dst, t, key), data...), nil
}

// appendDoc appends the shaped document doc whose state is st; its fields
// are at depth.
func (w *walk) appendDoc(dst, doc []byte, st state, depth int) ([]byte, error) {
	length, rem, ok := bsoncore.ReadLength(doc)
	if !ok || int(length) > len(doc) || length < 5 {
		return nil, errMalformed
	}
	rem = rem[:length-5]
	idx, dst := bsoncore.AppendDocumentStart(dst)
	for len(rem) > 0 {
		el, rest, ok := bsoncore.ReadElement(rem)
		if !ok {
			return nil, errMalformed
		}
		rem = rest
		kb := el.KeyBytes()
		v, err := el.ValueErr()
		if err != nil {
			return nil, errMalformed
		}
		if dst, err = w.appendValue(dst, kb, v.Type, v.Data, w.child(st, kb, depth), depth); err != nil {
			return nil, err
		}
	}
	return bsoncore.AppendDocumentEnd(dst, idx)
}

// appendArray shapes each element at the array's own state (a MongoDB path
// goes through arrays); partial drops scalar elements, as an inclusion
// projection does.
func (w *walk) appendArray(dst, arr []byte, st state, partial bool, depth int) ([]byte, error) {
	length, rem, ok := bsoncore.ReadLength(arr)
	if !ok || int(length) > len(arr) || length < 5 {
		return nil, errMalformed
	}
	rem = rem[:length-5]
	idx, dst := bsoncore.AppendArrayStart(dst)
	n := 0
	for len(rem) > 0 {
		el, rest, ok := bsoncore.ReadElement(rem)
		if !ok {
			return nil, errMalformed
		}
		rem = rest
		v, err := el.ValueErr()
		if err != nil {
			return nil, errMalformed
		}
		k := arrayKey(n)
		switch v.Type {
		case bsoncore.TypeEmbeddedDocument:
			dst, err = w.appendDoc(bsoncore.AppendHeader(dst, v.Type, k), v.Data, st, depth)
		case bsoncore.TypeArray:
			dst, err = w.appendArray(bsoncore.AppendHeader(dst, v.Type, k), v.Data, st, partial, depth)
		default:
			if partial {
				continue
			}
			dst = append(bsoncore.AppendHeader(dst, v.Type, k), v.Data...)
		}
		if err != nil {
			return nil, err
		}
		n++
	}
	return bsoncore.AppendArrayEnd(dst, idx)
}

// appendRedacted appends the element key with the replacement of a value
// of type t: the mask or the HMAC, as a string; an array keeps its length,
// each element redacted.
func (r *redaction) appendRedacted(dst []byte, key string, t bsoncore.Type, data []byte) ([]byte, error) {
	if t == bsoncore.TypeArray {
		vals, err := bsoncore.Document(data).Values()
		if err != nil {
			return nil, errMalformed
		}
		idx, out := bsoncore.AppendArrayElementStart(dst, key)
		for i, v := range vals {
			if out, err = r.appendRedacted(out, arrayKey(i), v.Type, v.Data); err != nil {
				return nil, err
			}
		}
		return bsoncore.AppendArrayEnd(out, idx)
	}
	if !r.hash {
		return bsoncore.AppendStringElement(dst, key, RedactMask), nil
	}
	return bsoncore.AppendStringElement(dst, key, r.mac(t, data)), nil
}

// mac returns the hex HMAC-SHA256 of a value under the redaction key: of a
// string's UTF-8 bytes (so a receiver holding the key can compute it from
// the plain value), or of the type byte and the raw BSON value for other
// types.
func (r *redaction) mac(t bsoncore.Type, data []byte) string {
	m := hmac.New(sha256.New, r.key)
	if t == bsoncore.TypeString {
		if str, _, ok := bsoncore.ReadString(data); ok {
			m.Write([]byte(str))
			return hex.EncodeToString(m.Sum(nil))
		}
	}
	m.Write([]byte{byte(t)})
	m.Write(data)
	return hex.EncodeToString(m.Sum(nil))
}

// shapedChange is the outcome of shaping one change document.
type shapedChange struct {
	raw   bson.Raw
	empty bool // an update whose shaped updateDescription is empty
}

// apply shapes the change document raw.
func (s *Shape) apply(raw bson.Raw, op string) (shapedChange, error) {
	out := shapedChange{raw: raw}
	if !s.touchesChange() && !s.skip {
		return out, nil
	}
	root := s.root()
	w := &walk{s: s}
	idx, dst := bsoncore.AppendDocumentStart(make([]byte, 0, len(raw)))
	sawUD := false
	err := forEach(raw, func(el bsoncore.Element) error {
		k := string(el.KeyBytes()) // compared only: no allocation
		v, err := el.ValueErr()
		if err != nil {
			return errMalformed
		}
		switch {
		case (k == "fullDocument" || k == "fullDocumentBeforeChange") && v.Type == bsoncore.TypeEmbeddedDocument && len(s.pats) > 0:
			dst = appendHeader(dst, bsoncore.TypeEmbeddedDocument, el.KeyBytes())
			if dst, err = w.appendDoc(dst, v.Data, root, 0); err != nil {
				return err
			}
		case k == "updateDescription" && v.Type == bsoncore.TypeEmbeddedDocument && !sawUD:
			sawUD = true
			ud, empty, err := s.updateDescription(w, v.Data, root)
			if err != nil {
				return err
			}
			out.empty = empty && op == "update"
			if !s.dropUD {
				dst = append(appendHeader(dst, bsoncore.TypeEmbeddedDocument, el.KeyBytes()), ud...)
			}
		default:
			dst = append(dst, el...)
		}
		return nil
	})
	if err != nil {
		return out, err
	}
	if !sawUD && op == "update" {
		out.empty = true
	}
	dst, err = bsoncore.AppendDocumentEnd(dst, idx)
	if err != nil {
		return out, err
	}
	out.raw = dst
	return out, nil
}

// updateDescription shapes an updateDescription: updatedFields values as
// the document's (their dotted keys are paths), removedFields,
// truncatedArrays and disambiguatedPaths entries kept when their path is,
// and max_updated_fields_bytes. empty reports that no updated, removed or
// truncated field is left.
func (s *Shape) updateDescription(w *walk, ud []byte, root state) (bsoncore.Document, bool, error) {
	kept := func(path string) bool {
		v, _ := s.judge(s.pathState(root, path))
		return v != vDrop
	}
	empty := true
	idx, dst := bsoncore.AppendDocumentStart(make([]byte, 0, len(ud)))
	err := forEach(ud, func(el bsoncore.Element) error {
		k := string(el.KeyBytes()) // compared only: no allocation
		v, err := el.ValueErr()
		if err != nil {
			return errMalformed
		}
		switch {
		case k == "updatedFields" && v.Type == bsoncore.TypeEmbeddedDocument:
			fi, fd := bsoncore.AppendDocumentStart(make([]byte, 0, len(v.Data)))
			err := forEach(v.Data, func(f bsoncore.Element) error {
				fv, err := f.ValueErr()
				if err != nil {
					return errMalformed
				}
				fd, err = w.appendValue(fd, f.KeyBytes(), fv.Type, fv.Data, s.pathState(root, string(f.KeyBytes())), 0)
				return err
			})
			if err != nil {
				return err
			}
			fd, _ = bsoncore.AppendDocumentEnd(fd, fi)
			if len(fd) > 5 {
				empty = false
			}
			if s.maxUF > 0 && len(fd) > s.maxUF {
				fd = bsoncore.NewDocumentBuilder().AppendBoolean("truncated", true).Build()
			}
			dst = append(appendHeader(dst, bsoncore.TypeEmbeddedDocument, el.KeyBytes()), fd...)
		case (k == "removedFields" || k == "truncatedArrays") && v.Type == bsoncore.TypeArray:
			ai, ad := bsoncore.AppendArrayStart(make([]byte, 0, len(v.Data)))
			n := 0
			err := forEach(v.Data, func(p bsoncore.Element) error {
				pv, err := p.ValueErr()
				if err != nil {
					return errMalformed
				}
				path, ok := pv.StringValueOK() // removedFields: the path
				if doc, isDoc := pv.DocumentOK(); isDoc {
					// truncatedArrays: {field, newSize}
					if f, err := doc.LookupErr("field"); err == nil {
						path, ok = f.StringValueOK()
					}
				}
				if ok && !kept(path) {
					return nil
				}
				ad = append(bsoncore.AppendHeader(ad, pv.Type, arrayKey(n)), pv.Data...)
				n++
				return nil
			})
			if err != nil {
				return err
			}
			ad, _ = bsoncore.AppendArrayEnd(ad, ai)
			if n > 0 {
				empty = false
			}
			dst = append(appendHeader(dst, bsoncore.TypeArray, el.KeyBytes()), ad...)
		case k == "disambiguatedPaths" && v.Type == bsoncore.TypeEmbeddedDocument:
			di, dd := bsoncore.AppendDocumentStart(make([]byte, 0, len(v.Data)))
			err := forEach(v.Data, func(p bsoncore.Element) error {
				if kept(string(p.KeyBytes())) {
					dd = append(dd, p...)
				}
				return nil
			})
			if err != nil {
				return err
			}
			dd, _ = bsoncore.AppendDocumentEnd(dd, di)
			dst = append(appendHeader(dst, bsoncore.TypeEmbeddedDocument, el.KeyBytes()), dd...)
		default:
			dst = append(dst, el...)
		}
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	dst, err = bsoncore.AppendDocumentEnd(dst, idx)
	return dst, empty, err
}

// pathState returns the state of a dotted updateDescription path below
// root. A field name made of digits may be an array index, which a document
// path does not name (MongoDB paths go through arrays): the state is then
// the union of both readings.
func (s *Shape) pathState(root state, path string) state {
	st := make(state, len(root))
	copy(st, root)
	for path != "" {
		var seg string
		seg, path, _ = strings.Cut(path, ".")
		idx := isDigits(seg)
		for i, p := range s.pats {
			n := p.step(st[i], seg)
			if idx {
				n |= st[i]
			}
			st[i] = n
		}
	}
	return st
}

// forEach calls fn with each element of the BSON document (or array) doc,
// stopping at fn's first error; malformed BSON is errMalformed.
func forEach(doc []byte, fn func(bsoncore.Element) error) error {
	length, rem, ok := bsoncore.ReadLength(doc)
	if !ok || int(length) > len(doc) || length < 5 {
		return errMalformed
	}
	rem = rem[:length-5]
	for len(rem) > 0 {
		el, rest, ok := bsoncore.ReadElement(rem)
		if !ok {
			return errMalformed
		}
		rem = rest
		if err := fn(el); err != nil {
			return err
		}
	}
	return nil
}

// --- shaped views of an event -----------------------------------------------

// shaping holds the shaping state of an Event: two pointers, so that an
// event that is never shaped stays small.
type shaping struct {
	view  *viewState              // set on a view: what it is a view of
	views atomic.Pointer[viewSet] // the views made from this event
}

// viewState is what a view knows beyond its Event fields.
type viewState struct {
	base     *Event // the event the view was made from
	shape    *Shape
	shapeErr error
	skip     bool
	record   [2]lazyJSON // Record's encodings (relaxed, canonical) of a document-form view
}

// viewSet holds the views of an event, one per shape fingerprint.
type viewSet struct {
	mu   sync.Mutex
	list []*Event
}

// Shaped returns the view of e that shape s makes: an Event with e's id,
// position and metadata whose Raw is the shaped change and whose Envelope
// is the shaped payload. skip reports an update whose shaped changes are
// empty under skip_empty_updates: it is not to be sent (but acknowledged).
// A nil shape returns e itself. Views are made once per (event, shape
// fingerprint) and cached on e, so sinks of the same shape share one view
// and its encodings; Shaped is safe for concurrent use. A change the shape
// cannot be applied to yields a view whose Envelope fails (the sink then
// fails it permanently and the dead letter keeps the raw change).
func (e *Event) Shaped(s *Shape) (view *Event, skip bool) {
	if s == nil {
		return e, false
	}
	base := e.Unshaped()
	set := base.views.Load()
	if set == nil {
		base.views.CompareAndSwap(nil, &viewSet{})
		set = base.views.Load()
	}
	set.mu.Lock()
	defer set.mu.Unlock()
	for _, v := range set.list {
		if v.view.shape.fp == s.fp {
			return v, v.view.skip
		}
	}
	v := &Event{
		ID: base.ID, Source: base.Source, Seq: base.Seq, Token: base.Token, OperationType: base.OperationType,
		DB: base.DB, Coll: base.Coll, DocumentKey: base.DocumentKey, ClusterTime: base.ClusterTime,
		WallTime: base.WallTime, Rules: base.Rules, Tenure: base.Tenure, Txn: base.Txn, Mem: base.Mem,
		Trace: base.Trace,
	}
	vs := &viewState{base: base, shape: s}
	v.view = vs
	sc, err := s.apply(base.Raw, base.OperationType)
	if err != nil {
		vs.shapeErr = fmt.Errorf("event %s: shape payload: %w", base.ID, err)
	} else {
		v.Raw = sc.raw
		vs.skip = sc.empty && s.skip
		if len(v.Raw) > 0 && (len(base.Raw) == 0 || &v.Raw[0] != &base.Raw[0]) {
			base.Mem.Grow(int64(cap(v.Raw))) // the view lives as long as its event
		}
	}
	set.list = append(set.list, v)
	return v, vs.skip
}

// Unshaped returns the event a view was made from (e itself when e is not
// a view): its Raw is the change as read, for dead letters and replay.
func (e *Event) Unshaped() *Event {
	if e.view != nil {
		return e.view.base
	}
	return e
}

// Shape returns the shape of a view (nil for an event that is not one).
func (e *Event) Shape() *Shape {
	if e.view == nil {
		return nil
	}
	return e.view.shape
}

// Form returns the envelope form of e's payload.
func (e *Event) Form() Form { return e.Shape().Form() }

// encodeShaped encodes the payload of e's form (Envelope's cache calls it).
func (e *Event) encodeShaped(canonical bool) ([]byte, error) {
	if e.view == nil {
		return e.encode(canonical)
	}
	if e.view.shapeErr != nil {
		return nil, e.view.shapeErr
	}
	switch e.Form() {
	case FormDocument:
		return e.encodeDocument(canonical)
	case FormKey:
		return e.encodeKey(canonical)
	}
	return e.encode(canonical)
}

// encodeDocument returns the shaped post-image as Extended JSON, or null
// when the change has none (a delete, an update without a lookup).
func (e *Event) encodeDocument(canonical bool) ([]byte, error) {
	v, err := e.Raw.LookupErr("fullDocument")
	if err != nil || v.Type != bson.TypeEmbeddedDocument {
		return []byte("null"), nil
	}
	if canonical && mayHaveDollarKey(v.Value) {
		if path := bsonraw.DollarPath(v.Document()); path != "" {
			return nil, fmt.Errorf("event %s: field %q: %w", e.ID, "fullDocument."+path, ErrAmbiguousJSON)
		}
	}
	b, err := encodeSized(len(v.Value), func(b []byte) ([]byte, error) {
		b, _, err := appendExtJSONValue(b, v.Type, v.Value, canonical)
		return b, err
	})
	if err != nil {
		if errors.Is(err, ErrInvalidUTF8) {
			return nil, fmt.Errorf("event %s: encode envelope: %w", e.ID, err)
		}
		if b, err = bson.MarshalExtJSON(v.Document(), canonical, false); err != nil {
			return nil, fmt.Errorf("event %s: encode envelope: %w", e.ID, err)
		}
	}
	return b, nil
}

// encodeKey returns {"id","operationType","ns","documentKey"} and, for an
// event of a transaction, "txn".
func (e *Event) encodeKey(canonical bool) ([]byte, error) {
	b := make([]byte, 0, 128+len(e.DocumentKey)*2)
	b = append(b, `{"id":`...)
	b = appendJSONString(b, e.ID)
	b = append(b, `,"operationType":`...)
	b = appendJSONString(b, e.OperationType)
	for _, k := range [...]string{"ns", "documentKey"} {
		v, err := e.Raw.LookupErr(k)
		if err != nil {
			continue
		}
		b = append(b, ',')
		b = appendJSONString(b, k)
		b = append(b, ':')
		if b, _, err = appendExtJSONValue(b, v.Type, v.Value, canonical); err != nil {
			return nil, fmt.Errorf("event %s: encode envelope: %w", e.ID, err)
		}
	}
	if e.Txn != nil {
		b = append(b, `,"txn":`...)
		b = appendTxnJSON(b, e.Txn)
	}
	return append(b, '}'), nil
}

// recordFields are the change fields of a document-form Record.
var recordFields = map[string]bool{"ns": true, "documentKey": true, "fullDocument": true, "to": true, "collectionUUID": true}

// encodeRecord encodes the full envelope of the change restricted to
// recordFields.
func (e *Event) encodeRecord(canonical bool) ([]byte, error) {
	elems, err := e.Raw.Elements()
	if err != nil {
		return nil, fmt.Errorf("event %s: encode envelope: %w", e.ID, err)
	}
	idx, dst := bsoncore.AppendDocumentStart(make([]byte, 0, len(e.Raw)))
	for _, el := range elems {
		if recordFields[el.Key()] {
			dst = append(dst, el...)
		}
	}
	dst, _ = bsoncore.AppendDocumentEnd(dst, idx)
	s := &Event{
		ID: e.ID, Source: e.Source, OperationType: e.OperationType, DB: e.DB, Coll: e.Coll,
		DocumentKey: e.DocumentKey, ClusterTime: e.ClusterTime, WallTime: e.WallTime, Raw: bson.Raw(dst), Rules: e.Rules, Txn: e.Txn,
	}
	return s.encode(canonical)
}

// Record returns the shaped payload as one self-contained JSON object: the
// Envelope for the full and key forms; for the document form, the envelope
// with its metadata (id, source, operationType, ns, documentKey,
// clusterTime, wallTime, rules) and the shaped post-image as fullDocument,
// without fullDocumentBeforeChange and updateDescription. It is what an
// EventBridge detail, a batched webhook's array element and a dead
// letter's envelope carry, where there are no per-event headers. Cached
// like Envelope.
func (e *Event) Record(canonical bool) ([]byte, error) {
	if e.Form() != FormDocument {
		return e.Envelope(canonical)
	}
	l := &e.view.record[0]
	if canonical {
		l = &e.view.record[1]
	}
	l.once.Do(func() {
		if e.view.shapeErr != nil {
			l.err = e.view.shapeErr
			return
		}
		l.b, l.err = e.encodeRecord(canonical)
		e.Mem.Grow(int64(cap(l.b)))
	})
	return l.b, l.err
}

// AppendRecord appends Record(canonical) to dst and returns the extended
// buffer (on an error, dst as given). An Exclusive event that is not a
// shaped view is encoded straight into dst and its encoding is not cached
// (nor charged to Mem): its one sink writes it into its request and nothing
// else reads it, which saves a copy and an allocation per event; a later
// Record or Envelope encodes it again. Any other event appends its cached
// Record, encoding and caching it first.
func (e *Event) AppendRecord(dst []byte, canonical bool) ([]byte, error) {
	if e.Exclusive && e.view == nil {
		return e.appendEncoded(dst, canonical)
	}
	b, err := e.Record(canonical)
	if err != nil {
		return dst, err
	}
	return append(dst, b...), nil
}

// MetaField is one item of a document-form payload's metadata.
type MetaField struct {
	// Name is the item's name, e.g. "operationType".
	Name string
	// Value is its value as text: the id, the operation type, the
	// namespace "db.coll", the documentKey as relaxed Extended JSON, the
	// cluster time as RFC 3339.
	Value string
}

// Metadata returns the metadata a document-form payload carries beside its
// body (webhook headers, SQS message attributes), in a fixed order: id,
// operationType, ns, documentKey, clusterTime, txn (its JSON object);
// items the event lacks are left out.
func (e *Event) Metadata() []MetaField {
	ns := e.DB
	if e.Coll != "" {
		ns += "." + e.Coll
	}
	m := []MetaField{{"id", e.ID}, {"operationType", e.OperationType}}
	if ns != "" {
		m = append(m, MetaField{"ns", ns})
	}
	if len(e.DocumentKey) > 0 {
		if b, err := bson.MarshalExtJSON(e.DocumentKey, false, false); err == nil {
			m = append(m, MetaField{"documentKey", string(b)})
		}
	}
	if e.ClusterTime.T != 0 {
		m = append(m, MetaField{"clusterTime", time.Unix(int64(e.ClusterTime.T), 0).UTC().Format(time.RFC3339)})
	}
	if e.Txn != nil {
		m = append(m, MetaField{"txn", e.Txn.JSON()})
	}
	return m
}
