package event

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
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
