// Package bsonraw reads encoded BSON in place, without decoding it into Go
// values: element iteration and field lookup, dotted field paths, numeric
// values, truth values and MongoDB's type aliases.
//
// It is the shared ground of package query (the filter language of
// changegate's rules, and MongoDB's comparison order) and of the test
// server's update, sort and projection semantics (test/mongowire/mql), so
// that both read BSON the same way. It holds no MongoDB semantics of its
// own beyond what both need. Every function is pure and allocation-free
// unless its doc comment says otherwise; results alias their input.
package bsonraw
