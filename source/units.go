package source

// Units: the names of a source's partitions and the $match stages that
// keep a stream to its partition and out of the state database.

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// UnitName is the name of partition i of n of source: the source's name
// when n is 1 (so checkpoints of unpartitioned sources keep their key),
// else "<source>#<i>/<n>".
func UnitName(source string, i, n int) string {
	if n <= 1 {
		return source
	}
	return fmt.Sprintf("%s#%d/%d", source, i, n)
}

// ParseUnit splits a unit name into its source, partition and partition
// count; a name without "#i/n" is a whole source (0, 1). ok is false for a
// malformed partition suffix.
func ParseUnit(unit string) (source string, i, n int, ok bool) {
	src, part, found := strings.Cut(unit, "#")
	if !found {
		return unit, 0, 1, true
	}
	is, ns, found := strings.Cut(part, "/")
	if !found {
		return src, 0, 0, false
	}
	i, err1 := strconv.Atoi(is)
	n, err2 := strconv.Atoi(ns)
	if err1 != nil || err2 != nil || n < 1 || i < 0 || i >= n {
		return src, 0, 0, false
	}
	return src, i, n, true
}

// StateFilter is the $match stage that leaves the changes of database db
// (changegate's state database) out of a cluster-level change stream:
// {"ns.db": {"$ne": db}}. A change without a namespace (none reaches a
// cluster-level stream today) passes.
func StateFilter(db string) bson.D {
	return bson.D{{Key: "$match", Value: bson.D{{Key: "ns.db", Value: bson.D{{Key: "$ne", Value: db}}}}}}
}

// PartitionFilter is the $match stage that keeps partition i of n of a
// change stream: the changes whose documentKey's hashed index key maps to
// i (((h mod n) + n) mod n, so negative hashes map too), and every change
// without a documentKey (drop, rename, dropDatabase and invalidate, which
// closes the cursor and must reach every partition's stream; only
// partition 0 dispatches them). It goes first in the pipeline, before the
// rules' pushdown and the source's own stages (which may reshape
// documentKey); consecutive $match stages are a conjunction.
func PartitionFilter(i, n int) bson.D {
	hash := bson.D{{Key: "$toHashedIndexKey", Value: "$documentKey"}}
	nn := int64(n)
	part := bson.D{{Key: "$mod", Value: bson.A{
		bson.D{{Key: "$add", Value: bson.A{bson.D{{Key: "$mod", Value: bson.A{hash, nn}}}, nn}}},
		nn,
	}}}
	return bson.D{{Key: "$match", Value: bson.D{{Key: "$or", Value: bson.A{
		bson.D{{Key: "documentKey", Value: bson.D{{Key: "$exists", Value: false}}}},
		bson.D{{Key: "$expr", Value: bson.D{{Key: "$eq", Value: bson.A{part, int64(i)}}}}},
	}}}}}
}

// isUnsupportedHash reports whether err is the server refusing the
// partition filter's expression (InvalidPipelineOperator, code 168).
func isUnsupportedHash(err error) bool {
	var se mongo.ServerError
	if errors.As(err, &se) {
		return se.HasErrorCode(168) || se.HasErrorMessage("$toHashedIndexKey")
	}
	return false
}
