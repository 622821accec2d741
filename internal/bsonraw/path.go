package bsonraw

import "strings"

// PathPart is one component of a dotted field path. Index is the array
// index the component denotes when it is a non-negative decimal integer
// without leading zeros (at most nine digits), else -1.
type PathPart struct {
	Name  string
	Index int
}

// SplitPath splits a dotted field path such as "items.0.sku" into its
// parts. It allocates the returned slice.
func SplitPath(path string) []PathPart {
	names := strings.Split(path, ".")
	parts := make([]PathPart, len(names))
	for i, n := range names {
		parts[i] = PathPart{Name: n, Index: ArrayIndex(n)}
	}
	return parts
}

// ArrayIndex returns the array index a path component denotes, or -1 (see
// [PathPart]).
func ArrayIndex(s string) int {
	if s == "" || len(s) > 9 || (len(s) > 1 && s[0] == '0') {
		return -1
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return -1
		}
		n = n*10 + int(s[i]-'0')
	}
	return n
}
