package bsonraw

import "go.mongodb.org/mongo-driver/v2/bson"

// typeAliases are the type names $type accepts (besides "number").
var typeAliases = map[string]bson.Type{
	"double": bson.TypeDouble, "string": bson.TypeString, "object": bson.TypeEmbeddedDocument,
	"array": bson.TypeArray, "binData": bson.TypeBinary, "undefined": bson.TypeUndefined,
	"objectId": bson.TypeObjectID, "bool": bson.TypeBoolean, "date": bson.TypeDateTime,
	"null": bson.TypeNull, "regex": bson.TypeRegex, "dbPointer": bson.TypeDBPointer,
	"javascript": bson.TypeJavaScript, "symbol": bson.TypeSymbol,
	"javascriptWithScope": bson.TypeCodeWithScope, "int": bson.TypeInt32,
	"timestamp": bson.TypeTimestamp, "long": bson.TypeInt64, "decimal": bson.TypeDecimal128,
	"minKey": bson.TypeMinKey, "maxKey": bson.TypeMaxKey,
}

// TypeByAlias returns the type MongoDB names alias ("double", "string",
// "objectId", ...), as $type accepts it. The group alias "number" is not a
// single type and is not known here.
func TypeByAlias(alias string) (bson.Type, bool) {
	t, ok := typeAliases[alias]
	return t, ok
}

// AliasOf returns MongoDB's alias of type t, the inverse of [TypeByAlias].
func AliasOf(t bson.Type) (string, bool) {
	for name, at := range typeAliases {
		if at == t {
			return name, true
		}
	}
	return "", false
}

// IsOperatorDoc reports whether an encoded document operand is a set of
// operators ({$gt: 1}) rather than a literal document: its first key
// starts with '$'. DBRef-like documents ({$ref, $id, $db}) are literals.
func IsOperatorDoc(v []byte) bool {
	it := NewIter(v)
	k, _, _, ok := it.Next()
	if !ok || len(k) == 0 || k[0] != '$' {
		return false
	}
	switch string(k) {
	case "$ref", "$id", "$db":
		return false
	}
	return true
}

// FirstElem returns the first element of an encoded document or array;
// all results are empty when it has none.
func FirstElem(doc []byte) (key []byte, t bson.Type, v []byte) {
	it := NewIter(doc)
	key, t, v, _ = it.Next()
	return key, t, v
}

// CanonicalType returns the server's canonicalizeBSONType of t: the rank
// MongoDB sorts and compares BSON types by (numbers share 10, strings and
// symbols 15, ...), with 0 for undefined and for t == 0 (EOO, which callers
// use for a missing value). ok is false for a type MongoDB does not know.
func CanonicalType(t bson.Type) (rank int32, ok bool) {
	switch t {
	case bson.TypeMinKey:
		return -1, true
	case bson.TypeMaxKey:
		return 127, true
	case 0, bson.TypeUndefined:
		return 0, true
	case bson.TypeNull:
		return 5, true
	case bson.TypeDouble, bson.TypeInt32, bson.TypeInt64, bson.TypeDecimal128:
		return 10, true
	case bson.TypeString, bson.TypeSymbol:
		return 15, true
	case bson.TypeEmbeddedDocument:
		return 20, true
	case bson.TypeArray:
		return 25, true
	case bson.TypeBinary:
		return 30, true
	case bson.TypeObjectID:
		return 35, true
	case bson.TypeBoolean:
		return 40, true
	case bson.TypeDateTime:
		return 45, true
	case bson.TypeTimestamp:
		return 47, true
	case bson.TypeRegex:
		return 50, true
	case bson.TypeDBPointer:
		return 55, true
	case bson.TypeJavaScript:
		return 60, true
	case bson.TypeCodeWithScope:
		return 65, true
	}
	return 0, false
}
