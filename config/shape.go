package config

import (
	"math"

	"github.com/changegate/changegate/event"
)

// Shape is the payload shaping of a [[rules]] or [[sinks]] entry (the same
// keys on both); where a rule and a sink both shape an event, the stricter
// of the two applies (see event.Stricter and docs/shaping.md).
// The zero value shapes nothing.
type Shape struct {
	// Fields is the projection (fields): MongoDB projection semantics
	// over the document, paths starting with "fullDocument."; all
	// inclusions or all exclusions, except fullDocument._id = 0 in an
	// inclusion. Empty: every field.
	Fields []ShapeField
	// Redact are the paths whose values are replaced (redact); "**"
	// stands for any number of fields.
	Redact []string
	// RedactMode is RedactMask (default) or RedactHash.
	RedactMode string
	// RedactKey is the HMAC-SHA256 key of RedactHash (redact_key,
	// secret-capable, at least MinRedactKeyBytes); empty otherwise.
	RedactKey Secret
	// Envelope is EnvelopeFull (default), EnvelopeDocument or EnvelopeKey.
	Envelope string
	// IncludeUpdateDescription is include_update_description (default
	// true).
	IncludeUpdateDescription bool
	// SkipEmptyUpdates is skip_empty_updates (default false).
	SkipEmptyUpdates bool
	// MaxUpdatedFieldsBytes is max_updated_fields_bytes: past this BSON
	// size, updatedFields becomes {"truncated": true}; 0: no limit.
	MaxUpdatedFieldsBytes int
}

// ShapeField is one entry of fields.
type ShapeField struct {
	// Path is the dotted field path, starting with "fullDocument.".
	Path string
	// Include is true for 1 (or true), false for 0 (or false).
	Include bool
}

// Redaction modes and envelope forms.
const (
	RedactMask       = "mask"
	RedactHash       = "hash"
	EnvelopeFull     = "full"
	EnvelopeDocument = "document"
	EnvelopeKey      = "key"
)

// MinRedactKeyBytes is the shortest redact_key accepted.
const MinRedactKeyBytes = 16

// Spec returns the shape as an event.ShapeSpec (compile it with
// event.CompileShape).
func (s Shape) Spec() event.ShapeSpec {
	spec := event.ShapeSpec{
		Redact:                s.Redact,
		RedactHash:            s.RedactMode == RedactHash,
		Envelope:              event.Forms[s.Envelope],
		DropUpdateDescription: !s.IncludeUpdateDescription,
		SkipEmptyUpdates:      s.SkipEmptyUpdates,
		MaxUpdatedFieldsBytes: s.MaxUpdatedFieldsBytes,
	}
	if spec.RedactHash {
		spec.RedactKey = []byte(s.RedactKey.Value())
	}
	for _, f := range s.Fields {
		spec.Fields = append(spec.Fields, event.Field{Path: f.Path, Include: f.Include})
	}
	return spec
}

// shape decodes the shaping keys of a rule or sink table.
func (d *decoder) shape(o *obj) Shape {
	s := Shape{RedactMode: RedactMask, Envelope: EnvelopeFull, IncludeUpdateDescription: true}
	if v := o.lookup("fields"); v != nil {
		s.Fields = d.shapeFields(o, v)
	}
	redact, elems, rv := o.strings("redact")
	if rv != nil && !o.bad["redact"] {
		if len(redact) == 0 {
			d.errorf(o.keyPath("redact"), rv.line, "must not be empty (omit it to redact nothing)")
		}
		seen := map[string]bool{}
		for i, p := range redact {
			if _, err := event.ParseShapePath(p, true); err != nil {
				d.errorf(indexPath(o.keyPath("redact"), i), elems[i].line, "%v", err)
				continue
			}
			if seen[p] {
				d.errorf(indexPath(o.keyPath("redact"), i), elems[i].line, "path %q is listed twice", p)
				continue
			}
			seen[p] = true
			s.Redact = append(s.Redact, p)
		}
	}
	s.RedactMode = o.enum("redact_mode", RedactMask, []string{RedactMask, RedactHash})
	key, kv := o.secret("redact_key")
	switch {
	case kv == nil:
		if s.RedactMode == RedactHash && !o.bad["redact_mode"] {
			d.errorf(o.keyPath("redact_mode"), o.lineOf("redact_mode"), `"hash" needs redact_key (a secret: "${VAR}" or "file:/path")`)
		}
	case o.bad["redact_key"]:
	case s.RedactMode != RedactHash:
		d.errorf(o.keyPath("redact_key"), kv.line, `applies only with redact_mode = "hash"`)
	case len(key.Value()) < MinRedactKeyBytes:
		d.errorf(o.keyPath("redact_key"), kv.line, "the key is %d bytes, want at least %d random bytes (e.g. the output of openssl rand -base64 32)", len(key.Value()), MinRedactKeyBytes)
	default:
		s.RedactKey = key
	}
	if s.RedactMode == RedactHash && rv == nil && o.t.get("redact_mode") != nil {
		d.errorf(o.keyPath("redact_mode"), o.lineOf("redact_mode"), "needs redact (the paths to redact)")
	}
	s.Envelope = o.enum("envelope", EnvelopeFull, []string{EnvelopeFull, EnvelopeDocument, EnvelopeKey})
	s.IncludeUpdateDescription = o.boolean("include_update_description", true)
	s.SkipEmptyUpdates = o.boolean("skip_empty_updates", false)
	s.MaxUpdatedFieldsBytes = int(o.integer("max_updated_fields_bytes", 0, 1, math.MaxInt32))
	return s
}

// shapeFields decodes fields: an inline table of paths to 0/1 (or
// false/true), or an array of paths to include.
func (d *decoder) shapeFields(o *obj, v *value) []ShapeField {
	path := o.keyPath("fields")
	var out []ShapeField
	type entry struct {
		path    string
		include bool
		line    int
		at      string
	}
	var entries []entry
	switch v.kind {
	case kindTable:
		if v.dotted {
			d.errorf(path, v.line, `an unquoted dotted key makes a nested table; quote the path: fields = { "fullDocument.email" = 0 }`)
			return nil
		}
		for _, k := range v.tbl.keys {
			e := v.tbl.m[k]
			at := joinPath(path, k)
			var inc, ok bool
			switch e.kind {
			case kindInteger:
				inc, ok = e.i == 1, e.i == 0 || e.i == 1
			case kindBool:
				inc, ok = e.b, true
			case kindTable:
				d.errorf(at, e.line, `an unquoted dotted key makes a nested table; quote the path: fields = { "fullDocument.email" = 0 }`)
				continue
			}
			if !ok {
				d.errorf(at, e.line, "must be 1 or true (include) or 0 or false (exclude), got %s", e.typeName())
				continue
			}
			entries = append(entries, entry{k, inc, e.line, at})
		}
	case kindArray:
		paths, elems, _ := o.strings("fields")
		if o.bad["fields"] {
			return nil
		}
		for i, p := range paths {
			entries = append(entries, entry{p, true, elems[i].line, indexPath(path, i)})
		}
	default:
		o.typeError("fields", v, `an inline table of paths to 0 or 1, or an array of paths to include`)
		return nil
	}
	if len(entries) == 0 {
		d.errorf(path, v.line, "must not be empty (omit it to keep every field)")
		return nil
	}
	var first *entry // the first entry other than _id: it sets the mode
	seen := map[string]bool{}
	for i := range entries {
		e := &entries[i]
		segs, err := event.ParseShapePath(e.path, false)
		if err != nil {
			d.errorf(e.at, e.line, "%v", err)
			continue
		}
		if seen[e.path] {
			d.errorf(e.at, e.line, "path %q is listed twice", e.path)
			continue
		}
		seen[e.path] = true
		if isID := len(segs) == 1 && segs[0] == "_id"; !isID {
			if first == nil {
				first = e
			} else if e.include != first.include {
				d.errorf(e.at, e.line, "fields mixes inclusion and exclusion (%q = %d, %q = %d): use one or the other (only %q = 0 may be added to an inclusion)",
					first.path, b2i(first.include), e.path, b2i(e.include), event.ShapePrefix+"._id")
				continue
			}
		}
		out = append(out, ShapeField{Path: e.path, Include: e.include})
	}
	return out
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
