package source

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestHasSplitEventAsLookup checks the fragments' quick test for a
// splitEvent field against raw.LookupErr, which add uses on a fragment.
func TestHasSplitEventAsLookup(t *testing.T) {
	doc := func(d bson.D) bson.Raw {
		raw, err := bson.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	id := bson.E{Key: "_id", Value: bson.D{{Key: "_data", Value: "82"}}}
	frag := doc(bson.D{id, {Key: "splitEvent", Value: bson.D{{Key: "fragment", Value: 1}, {Key: "of", Value: 2}}}})
	cases := map[string]bson.Raw{
		"fragment":        frag,
		"last field":      doc(bson.D{id, {Key: "operationType", Value: "insert"}, {Key: "splitEvent", Value: "x"}}),
		"plain change":    doc(bson.D{id, {Key: "operationType", Value: "insert"}, {Key: "fullDocument", Value: bson.D{{Key: "a", Value: 1}}}}),
		"nested":          doc(bson.D{id, {Key: "fullDocument", Value: bson.D{{Key: "splitEvent", Value: bson.D{}}}}}),
		"longer key":      doc(bson.D{id, {Key: "splitEvents", Value: 1}}),
		"shorter key":     doc(bson.D{id, {Key: "splitEven", Value: "t\x00abcdefghij"}}),
		"empty":           doc(bson.D{}),
		"truncated":       frag[:len(frag)-6],
		"bad length":      append(bson.Raw{0xff, 0xff, 0xff, 0x7f}, frag[4:]...),
		"short":           bson.Raw{5, 0},
		"malformed first": append(append(bson.Raw{}, frag[:4]...), append([]byte{0x02, 'a', 0, 0xff, 0xff, 0xff, 0xff}, frag[4:]...)...),
	}
	for name, raw := range cases {
		_, err := raw.LookupErr("splitEvent")
		if got, want := hasSplitEvent(raw), err == nil; got != want {
			t.Errorf("%s: hasSplitEvent = %v, LookupErr found it: %v", name, got, want)
		}
	}
	if !hasSplitEvent(frag) {
		t.Error("a fragment is not recognised")
	}
}
