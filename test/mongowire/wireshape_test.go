package mongowire_test

// Regression tests for reply shapes a second client (the Node.js driver,
// see compat/node) relies on and MongoDB 7 produces.

import (
	"testing"

	"github.com/changegate/changegate/test/mongowire"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestDuplicateKeyErrorInfo: MongoDB reports the index key pattern and the
// duplicate key with every 11000, as keyPattern and keyValue, in write
// errors and in command errors (findAndModify).
func TestDuplicateKeyErrorInfo(t *testing.T) {
	srv := startServer(t, mongowire.Options{})
	r := dialRaw(t, srv.Addr())
	run := func(body bson.D) bson.Raw {
		t.Helper()
		r.msg(0, append(body, bson.E{Key: "$db", Value: "app"}))
		_, _, doc := r.reply()
		return doc
	}
	run(bson.D{{Key: "createIndexes", Value: "c"}, {Key: "indexes", Value: bson.A{
		bson.D{{Key: "key", Value: bson.D{{Key: "email", Value: 1}, {Key: "org", Value: 1}}}, {Key: "name", Value: "email_org"}, {Key: "unique", Value: true}}}}})
	run(bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{{Key: "_id", Value: 1}, {Key: "email", Value: "a@x"}, {Key: "org", Value: 7}}}}})

	check := func(what string, e bson.Raw, pattern, value bson.D) {
		t.Helper()
		if e.Lookup("code").Int32() != 11000 {
			t.Fatalf("%s: not a duplicate key error: %v", what, e)
		}
		if got, want := docOf(e, "keyPattern"), bson.Raw(marshal(t, pattern)); got.String() != want.String() {
			t.Errorf("%s: keyPattern = %v, want %v", what, got, want)
		}
		if got, want := docOf(e, "keyValue"), bson.Raw(marshal(t, value)); got.String() != want.String() {
			t.Errorf("%s: keyValue = %v, want %v", what, got, want)
		}
	}
	dupID := run(bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{{Key: "_id", Value: 1}}}}})
	check("insert duplicate _id", dupID.Lookup("writeErrors", "0").Document(), bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "_id", Value: 1}})

	dupKey := run(bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{{Key: "_id", Value: 2}, {Key: "email", Value: "a@x"}, {Key: "org", Value: 7}}}}})
	check("insert duplicate unique key", dupKey.Lookup("writeErrors", "0").Document(),
		bson.D{{Key: "email", Value: 1}, {Key: "org", Value: 1}}, bson.D{{Key: "email", Value: "a@x"}, {Key: "org", Value: 7}})

	fam := run(bson.D{{Key: "findAndModify", Value: "c"}, {Key: "query", Value: bson.D{{Key: "_id", Value: 3}}},
		{Key: "update", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "email", Value: "a@x"}, {Key: "org", Value: 7}}}}}, {Key: "upsert", Value: true}})
	if ok, _ := fam.Lookup("ok").AsFloat64OK(); ok != 0 || fam.Lookup("codeName").StringValue() != "DuplicateKey" {
		t.Fatalf("findAndModify duplicate = %v", fam)
	}
	check("findAndModify", fam, bson.D{{Key: "email", Value: 1}, {Key: "org", Value: 1}}, bson.D{{Key: "email", Value: "a@x"}, {Key: "org", Value: 7}})
}

// docOf returns the document at key, or an empty document.
func docOf(doc bson.Raw, key string) bson.Raw {
	d, ok := doc.Lookup(key).DocumentOK()
	if !ok {
		return bson.Raw{5, 0, 0, 0, 0}
	}
	return d
}
