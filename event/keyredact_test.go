package event

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestRedactKey(t *testing.T) {
	key, err := bson.Marshal(bson.D{{Key: "_id", Value: int32(42)}, {Key: "email", Value: "ann@example.com"}, {Key: "region", Value: "eu"}})
	if err != nil {
		t.Fatal(err)
	}
	hashKey := []byte("k-0123456789abcdef")
	for _, c := range []struct {
		name string
		spec *ShapeSpec // nil: no shape
		want bson.D
		same bool // the key itself is returned
	}{
		{name: "no shape", want: bson.D{{Key: "_id", Value: int32(42)}, {Key: "email", Value: "ann@example.com"}, {Key: "region", Value: "eu"}}, same: true},
		{name: "projection only", spec: &ShapeSpec{Fields: []Field{{Path: "fullDocument.total", Include: true}}},
			want: bson.D{{Key: "_id", Value: int32(42)}, {Key: "email", Value: "ann@example.com"}, {Key: "region", Value: "eu"}}, same: true},
		{name: "redaction of another field", spec: &ShapeSpec{Redact: []string{"fullDocument.card"}},
			want: bson.D{{Key: "_id", Value: int32(42)}, {Key: "email", Value: "ann@example.com"}, {Key: "region", Value: "eu"}}, same: true},
		{name: "mask", spec: &ShapeSpec{Redact: []string{"fullDocument.email"}},
			want: bson.D{{Key: "_id", Value: int32(42)}, {Key: "email", Value: RedactMask}, {Key: "region", Value: "eu"}}},
		{name: "any depth", spec: &ShapeSpec{Redact: []string{"fullDocument.**.region"}},
			want: bson.D{{Key: "_id", Value: int32(42)}, {Key: "email", Value: "ann@example.com"}, {Key: "region", Value: RedactMask}}},
		{name: "hash", spec: &ShapeSpec{Redact: []string{"fullDocument.email"}, RedactHash: true, RedactKey: hashKey},
			want: bson.D{{Key: "_id", Value: int32(42)}, {Key: "email", Value: hmacHex(string(hashKey), "ann@example.com")}, {Key: "region", Value: "eu"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var s *Shape
			if c.spec != nil {
				s = mustShape(t, *c.spec)
			}
			got, err := s.RedactKey(key)
			if err != nil {
				t.Fatal(err)
			}
			want, _ := bson.Marshal(c.want)
			if string(got) != string(want) {
				t.Errorf("RedactKey = %s, want %s", bson.Raw(got), bson.Raw(want))
			}
			if same := len(got) > 0 && &got[0] == &key[0]; same != c.same {
				t.Errorf("returned the key itself: %v, want %v", same, c.same)
			}
		})
	}
	if _, err := mustShape(t, ShapeSpec{Redact: []string{"fullDocument.email"}}).RedactKey(bson.Raw{9, 0, 0}); err == nil {
		t.Error("a malformed key: no error")
	}
}
