package bsonraw

import (
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// DollarPath returns the dotted path of the first field of doc, at any depth
// (embedded documents, arrays and the scope of code with scope), whose name
// starts with "$", or "" when there is none (or doc is not a document).
// Such a field is a query operator in a filter, and reads back as a typed
// value from Extended JSON.
func DollarPath(doc bson.Raw) string { return dollarPath(doc, "") }

func dollarPath(doc bson.Raw, prefix string) string {
	elems, err := doc.Elements()
	if err != nil {
		return ""
	}
	for _, el := range elems {
		path := el.Key()
		if prefix != "" {
			path = prefix + "." + path
		}
		if strings.HasPrefix(el.Key(), "$") {
			return path
		}
		var sub bson.Raw
		switch v := el.Value(); v.Type {
		case bson.TypeEmbeddedDocument:
			sub = v.Document()
		case bson.TypeArray:
			sub = bson.Raw(v.Array())
		case bson.TypeCodeWithScope:
			_, sub, _ = v.CodeWithScopeOK()
		}
		if sub != nil {
			if p := dollarPath(sub, path); p != "" {
				return p
			}
		}
	}
	return ""
}
