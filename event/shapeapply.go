package event

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// This file applies a compiled shape to the BSON of a change: the projection
// and redaction of fullDocument and fullDocumentBeforeChange, and the
// updateDescription options, in one walk that copies what it keeps.

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
