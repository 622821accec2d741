package query

import (
	"fmt"

	"github.com/changegate/changegate/internal/bsonraw"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// Condition is a compiled condition on one value: a document of field
// operators such as {"$gte": 5, "$lt": 10}, or a regular expression. Unlike
// a field clause of a [Filter] it tests the value itself: an array is not
// searched for a matching element. It is what $elemMatch applies to each
// element of an array when its operand holds operators
// ({"$elemMatch": {"$gte": 5}}), and what an update's $pull applies to each
// element. A Condition is immutable and safe for concurrent use.
type Condition struct {
	p pred
}

// IsCondition reports whether the encoded document doc is an operator
// document [CompileCondition] takes: its first key is a field operator
// ($gt, $in, ...), neither a logical operator ($and, $or, ...) nor a DBRef
// field ($ref, $id, $db).
func IsCondition(doc []byte) bool {
	first, _, _ := bsonraw.FirstElem(doc)
	return bsonraw.IsOperatorDoc(doc) && !isLogicalOp(string(first))
}

// CompileCondition compiles cond, an operator document for which
// [IsCondition] holds or a regular expression. Errors in an operator
// document name path, as those of [Compile] do.
func CompileCondition(path string, cond bson.RawValue) (*Condition, error) {
	switch {
	case cond.Type == bson.TypeRegex:
		p, o := bsonraw.RegexParts(cond.Value)
		re, err := compileRegex(string(p), string(o))
		if err != nil {
			return nil, err
		}
		return &Condition{p: re}, nil
	case cond.Type == bson.TypeEmbeddedDocument && IsCondition(cond.Value):
		exprs, err := parseOps(path, cond.Value)
		if err != nil {
			return nil, err
		}
		return &Condition{p: toPred(exprs)}, nil
	}
	return nil, fmt.Errorf("a condition needs an operator document or a regular expression at %s", path)
}

// Match reports whether v satisfies the condition. It does not modify v.
func (c *Condition) Match(v bson.RawValue) bool {
	return c.p.value(v.Type, v.Value)
}
