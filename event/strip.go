package event

import (
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// StripLevel says how much of a change a stripped envelope leaves out, for a
// sink whose payload limit the whole envelope exceeds (oversize = "strip").
// Each level leaves out what the one before it does, and more.
type StripLevel int

const (
	// StripDocuments leaves out fullDocument and fullDocumentBeforeChange;
	// documentKey stays, so the receiver can fetch the document.
	StripDocuments StripLevel = iota + 1
	// StripUpdatedFields also replaces updateDescription.updatedFields with
	// the truncation marker {"truncated": true}; removedFields and the
	// other members of updateDescription stay.
	StripUpdatedFields
	// StripUpdateDescription replaces every member of updateDescription
	// (updatedFields, removedFields, truncatedArrays, disambiguatedPaths)
	// with the truncation marker.
	StripUpdateDescription
)

// TruncatedMarker is the BSON document {truncated: true}, which takes the
// place of a part of a change left out of a payload: updatedFields (and,
// at StripUpdateDescription, the other members of updateDescription) in a
// stripped envelope. In JSON it is {"truncated":true}, the same form as an
// updatedFields larger than a sink's max_updated_fields_bytes.
var TruncatedMarker = bson.Raw(bsoncore.NewDocumentBuilder().AppendBoolean("truncated", true).Build())

// strippedFields are left out of every stripped envelope.
var strippedFields = map[string]bool{"fullDocument": true, "fullDocumentBeforeChange": true}

// StripsUpdateDescription reports whether level l touches updateDescription
// and e has one, i.e. whether StrippedEnvelope at l can be smaller than at
// StripDocuments.
func (e *Event) StripsUpdateDescription(l StripLevel) bool {
	if l < StripUpdatedFields {
		return false
	}
	_, err := e.Raw.LookupErr("updateDescription")
	return err == nil
}

// StrippedEnvelope returns the envelope of e stripped at level (see
// StripLevel), with "truncated": true as its last field: the receiver keeps
// the id, documentKey and the rest and can fetch the document itself. It is
// encoded on every call; the cached Envelope is not changed.
func (e *Event) StrippedEnvelope(canonical bool, level StripLevel) ([]byte, error) {
	raw, err := strip(e.Raw, level)
	if err != nil {
		return nil, fmt.Errorf("event %s: strip envelope: %w", e.ID, err)
	}
	s := &Event{
		ID: e.ID, Source: e.Source, Seq: e.Seq, Token: e.Token, OperationType: e.OperationType,
		DB: e.DB, Coll: e.Coll, DocumentKey: e.DocumentKey, ClusterTime: e.ClusterTime,
		WallTime: e.WallTime, Raw: raw, Rules: e.Rules, Tenure: e.Tenure,
	}
	b, err := s.encode(canonical)
	if err != nil {
		return nil, err
	}
	// b ends with the "rules" array and "}".
	return append(b[:len(b)-1:len(b)-1], `,"truncated":true}`...), nil
}

// strip returns a copy of the change raw stripped at level.
func strip(raw bson.Raw, level StripLevel) (bson.Raw, error) {
	elems, err := raw.Elements()
	if err != nil {
		return nil, err
	}
	idx, dst := bsoncore.AppendDocumentStart(make([]byte, 0, 256))
	for _, el := range elems {
		switch {
		case strippedFields[el.Key()]:
		case el.Key() == "updateDescription" && level >= StripUpdatedFields:
			ud, ok := el.Value().DocumentOK()
			if !ok {
				dst = append(dst, el...)
				continue
			}
			uelems, err := ud.Elements()
			if err != nil {
				return nil, err
			}
			uidx, d := bsoncore.AppendDocumentElementStart(dst, "updateDescription")
			for _, u := range uelems {
				if u.Key() == "updatedFields" || level >= StripUpdateDescription {
					d = bsoncore.AppendDocumentElement(d, u.Key(), TruncatedMarker)
				} else {
					d = append(d, u...)
				}
			}
			dst, _ = bsoncore.AppendDocumentEnd(d, uidx)
		default:
			dst = append(dst, el...)
		}
	}
	dst, err = bsoncore.AppendDocumentEnd(dst, idx)
	return bson.Raw(dst), err
}
