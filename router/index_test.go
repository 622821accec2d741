package router

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/event"
)

// indexEvent builds a change of source "orders" with fullDocument fields.
func indexEvent(t testing.TB, seq int, op, db, coll string, doc bson.D) *event.Event {
	t.Helper()
	ct := bson.Timestamp{T: ctBase, I: uint32(seq)}
	raw, err := bson.Marshal(bson.D{
		{Key: "_id", Value: bson.D{{Key: "_data", Value: fmt.Sprintf("82%08X%08X2B0229296E04", ct.T, ct.I)}}},
		{Key: "operationType", Value: op},
		{Key: "clusterTime", Value: ct},
		{Key: "ns", Value: bson.D{{Key: "db", Value: db}, {Key: "coll", Value: coll}}},
		{Key: "documentKey", Value: bson.D{{Key: "_id", Value: seq}}},
		{Key: "fullDocument", Value: doc},
	})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := event.FromChange("orders", uint64(seq), raw)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

// TestIndexedRouteEqualsScan routes many changes among many rules (the
// index: operations, namespaces, equality values of every type it holds,
// values it cannot hold, arrays on the path, missing paths) and compares
// each Match with the rules' plain scan.
func TestIndexedRouteEqualsScan(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	ops := []string{"insert", "update", "delete", "replace"}
	values := []any{"a", "b", int32(1), int64(1), 1.0, 1.5, int64(2), true, false,
		bson.ObjectID{1}, bson.ObjectID{2}, bson.Symbol("a"), bson.NewDecimal128(0x3040000000000000, 1), nil}
	pick := func() any { return values[rnd.IntN(len(values))] }
	var specs []RuleSpec
	var sinkNames []string
	for i := range 300 {
		sp := RuleSpec{Name: fmt.Sprintf("r%d", i), Source: "orders", Sinks: []string{fmt.Sprintf("s%d", i%70)}}
		if rnd.IntN(2) == 0 {
			sp.Operations = []string{ops[rnd.IntN(4)], ops[rnd.IntN(4)]}
		}
		switch rnd.IntN(4) {
		case 0:
			sp.Namespaces = []string{"shop.orders"}
		case 1:
			sp.Namespaces = []string{"shop.*", "other.x"}
		}
		switch rnd.IntN(6) {
		case 0: // no filter
		case 1:
			sp.Filter = bson.D{{Key: "fullDocument.k", Value: pick()}}
		case 2:
			sp.Filter = bson.D{{Key: "$and", Value: bson.A{
				bson.D{{Key: "fullDocument.k", Value: bson.D{{Key: "$eq", Value: pick()}}}},
				bson.D{{Key: "clusterTime", Value: bson.D{{Key: "$gte", Value: bson.Timestamp{T: ctBase, I: uint32(rnd.IntN(50))}}}}},
			}}}
		case 3:
			sp.Filter = bson.D{{Key: "fullDocument.n.v", Value: pick()}, {Key: "fullDocument.k", Value: pick()}}
		case 4:
			sp.Filter = bson.D{{Key: "fullDocument.k", Value: bson.D{{Key: "$in", Value: bson.A{pick(), pick()}}}}}
		case 5:
			sp.Filter = bson.D{{Key: "$or", Value: bson.A{bson.D{{Key: "fullDocument.k", Value: pick()}}, bson.D{{Key: "fullDocument.n.v", Value: pick()}}}}}
		}
		specs = append(specs, sp)
	}
	for i := range 70 {
		sinkNames = append(sinkNames, fmt.Sprintf("s%d", i))
	}
	rules, err := CompileRules(specs, sinkNames)
	if err != nil {
		t.Fatal(err)
	}
	if rules.index["orders"] == nil {
		t.Fatal("300 rules of one source are not indexed")
	}
	scan, err := CompileRules(specs, sinkNames)
	if err != nil {
		t.Fatal(err)
	}
	scan.index = nil
	nss := [][2]string{{"shop", "orders"}, {"shop", "items"}, {"other", "x"}, {"else", "y"}}
	matched := 0
	for seq := range 3000 {
		doc := bson.D{{Key: "_id", Value: seq}}
		switch rnd.IntN(5) {
		case 0: // no k
		case 1:
			doc = append(doc, bson.E{Key: "k", Value: bson.A{pick(), pick()}})
		default:
			doc = append(doc, bson.E{Key: "k", Value: pick()})
		}
		switch rnd.IntN(4) {
		case 0:
			doc = append(doc, bson.E{Key: "n", Value: bson.D{{Key: "v", Value: pick()}}})
		case 1:
			doc = append(doc, bson.E{Key: "n", Value: bson.A{bson.D{{Key: "v", Value: pick()}}}})
		case 2:
			doc = append(doc, bson.E{Key: "n", Value: "scalar"})
		}
		ns := nss[rnd.IntN(len(nss))]
		ev := indexEvent(t, seq, ops[rnd.IntN(4)], ns[0], ns[1], doc)
		got, want := rules.Route(ev), scan.Route(ev)
		if !slices.Equal(got.Rules, want.Rules) || !slices.Equal(got.Sinks, want.Sinks) {
			t.Fatalf("change %d (%s): indexed %v, scan %v", seq, ev.Raw, got, want)
		}
		matched += len(want.Rules)
	}
	if matched == 0 {
		t.Fatal("no change matched a rule: the comparison shows nothing")
	}
}
