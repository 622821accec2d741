package awstest

import (
	"crypto/md5"
	"encoding/binary"
	"encoding/hex"
	"slices"
)

// MessageAttribute is an SQS message attribute value as sent.
type MessageAttribute struct {
	DataType         string // "String", "Number", "Binary", optionally with a ".custom" suffix
	StringValue      string
	BinaryValue      []byte
	StringListValues []string // reserved by SQS; stored if sent
	BinaryListValues [][]byte // reserved by SQS; stored if sent
}

// MD5OfMessageAttributes computes the digest SQS returns as
// MD5OfMessageAttributes (and MD5OfMessageSystemAttributes): attributes in
// order of name, each as length-prefixed (4-byte big-endian) name, data type,
// a transport-type byte (1 string, 2 binary, 3 string list, 4 binary list)
// and length-prefixed value(s). It returns "" for no attributes.
func MD5OfMessageAttributes(attrs map[string]MessageAttribute) string {
	if len(attrs) == 0 {
		return ""
	}
	names := make([]string, 0, len(attrs))
	for n := range attrs {
		names = append(names, n)
	}
	slices.Sort(names)
	h := md5.New()
	put := func(b []byte) {
		var l [4]byte
		binary.BigEndian.PutUint32(l[:], uint32(len(b)))
		h.Write(l[:])
		h.Write(b)
	}
	for _, n := range names {
		a := attrs[n]
		put([]byte(n))
		put([]byte(a.DataType))
		switch {
		case a.StringValue != "" || (a.BinaryValue == nil && a.StringListValues == nil && a.BinaryListValues == nil):
			h.Write([]byte{1})
			put([]byte(a.StringValue))
		case a.BinaryValue != nil:
			h.Write([]byte{2})
			put(a.BinaryValue)
		case a.StringListValues != nil:
			h.Write([]byte{3})
			for _, v := range a.StringListValues {
				put([]byte(v))
			}
		default:
			h.Write([]byte{4})
			for _, v := range a.BinaryListValues {
				put(v)
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// md5Hex is the MD5OfMessageBody digest.
func md5Hex(s string) string {
	sum := md5.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}
