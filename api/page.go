package api

import (
	"encoding/json"
	"io"
	"net/http"
)

// Listing limits: a listing returns DefaultListLimit items unless its
// limit parameter says otherwise, and at most MaxListLimit; a client pages
// with the after parameter (the next cursor of the previous page).
const (
	DefaultListLimit = 100
	MaxListLimit     = 1000
)

// Page streams one page of a cursor-paged listing, so that memory stays
// bounded by one item whatever the page holds:
//
//	{"<field>": [item, ...], "next": CURSOR, "error": MSG}
//
// next is the cursor of the next page (its after parameter), present when
// the page is full; error is present when the listing failed after the page
// began (the items before it are valid, the page is incomplete). A Page is
// used by one handler goroutine.
type Page struct {
	w       http.ResponseWriter
	field   string
	limit   int
	n       int
	last    string
	started bool
}

// NewPage returns a page of at most limit items under field.
func NewPage(w http.ResponseWriter, field string, limit int) *Page {
	return &Page{w: w, field: field, limit: limit}
}

// Begin answers 200 and starts the page: call it once the listing is
// known to succeed (its first read answered).
func (p *Page) Begin() {
	p.started = true
	p.w.Header().Set("Content-Type", "application/json")
	p.w.WriteHeader(http.StatusOK)
	f, _ := json.Marshal(p.field)
	_, _ = io.WriteString(p.w, "{"+string(f)+":[")
}

// Began reports whether Begin was called: an error before it is answered
// as an error response (WriteError), not inside the page.
func (p *Page) Began() bool { return p.started }

// Add writes item, a JSON value, whose cursor is cursor.
func (p *Page) Add(item []byte, cursor string) error {
	sep := "\n  "
	if p.n > 0 {
		sep = ",\n  "
	}
	if _, err := io.WriteString(p.w, sep); err != nil {
		return err
	}
	if _, err := p.w.Write(item); err != nil {
		return err
	}
	p.n++
	p.last = cursor
	return nil
}

// End ends the page begun; err is the listing's error, if any.
func (p *Page) End(err error) {
	tail := "\n]"
	if p.n == 0 {
		tail = "]"
	}
	if err == nil && p.n == p.limit {
		nb, _ := json.Marshal(p.last)
		tail += `,"next":` + string(nb)
	}
	if err != nil {
		eb, _ := json.Marshal(err.Error())
		tail += `,"error":` + string(eb)
	}
	_, _ = io.WriteString(p.w, tail+"}\n")
}
