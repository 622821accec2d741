package subscription

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/changegate/changegate/config"
)

// Collections of the state database, and the stored format.
const (
	// DefaultCollection holds the subscriptions.
	DefaultCollection = "subscriptions"
	// DefaultAuditCollection holds the audit log.
	DefaultAuditCollection = "subscriptions_audit"
	// FormatVersion is the "version" of the documents this release writes;
	// it reads every version up to it (readRecord).
	FormatVersion = 1
	// DefaultPageSize and MaxPageSize bound List.
	DefaultPageSize = 100
	MaxPageSize     = 1000
)

// Errors of the Store, for errors.Is.
var (
	// ErrNotFound: no subscription of that name.
	ErrNotFound = errors.New("subscription not found")
	// ErrExists: a subscription of that name exists already.
	ErrExists = errors.New("a subscription of that name exists already")
	// ErrConflict: the subscription changed since the revision given.
	ErrConflict = errors.New("the subscription changed since the revision given (read it again, then retry)")
	// ErrLimit: max_subscriptions are stored already.
	ErrLimit = errors.New("the most subscriptions allowed (max_subscriptions) are stored already")
	// ErrBadCursor: a List cursor that List did not return.
	ErrBadCursor = errors.New("invalid cursor")
	// ErrFormat: a stored document this release cannot read.
	ErrFormat = errors.New("unreadable stored subscription")
)

// Audit actions.
const (
	ActionCreate  = "create"
	ActionUpdate  = "update"
	ActionPause   = "pause"
	ActionResume  = "resume"
	ActionDisable = "disable"
	ActionRotate  = "rotate-secret"
	ActionDelete  = "delete"
)

// AuditRecord is one entry of the audit log: who did what to which
// subscription, and when. It never holds a secret.
type AuditRecord struct {
	ID           bson.ObjectID `bson:"_id" json:"-"`
	At           time.Time     `bson:"at" json:"at"`
	Actor        string        `bson:"actor" json:"actor"`
	Action       string        `bson:"action" json:"action"`
	Subscription string        `bson:"subscription" json:"subscription"`
	// Revision is the subscription's revision after the action (for a
	// delete, the revision deleted).
	Revision int64 `bson:"revision" json:"revision"`
	// Detail adds what the action was about: the fields an update
	// changed, a pause's reason, a rotation's overlap.
	Detail string `bson:"detail,omitempty" json:"detail,omitempty"`
}

// record is the stored form of a Subscription (format FormatVersion).
type record struct {
	Name    string `bson:"_id"`
	Version int    `bson:"version"`
	// Spec is the JSON form as a string: its filter's field names may
	// start with "$", which MongoDB stores only with restrictions.
	Spec      string         `bson:"spec"`
	Status    Status         `bson:"status"`
	Reason    string         `bson:"reason,omitempty"`
	Created   created        `bson:"created"`
	UpdatedAt time.Time      `bson:"updated_at"`
	Rev       int64          `bson:"rev"`
	Secrets   []SealedSecret `bson:"secrets"`
}

// created is nested: MongoDB replaces an empty timestamp in a top-level
// field of an inserted document with the current time.
type created struct {
	ClusterTime bson.Timestamp `bson:"cluster_time"`
	At          time.Time      `bson:"at"`
}

func toRecord(s *Subscription) record {
	return record{
		Name: s.Name, Version: FormatVersion, Spec: string(s.Spec), Status: s.Status, Reason: s.Reason,
		Created:   created{ClusterTime: s.CreatedClusterTime, At: s.CreatedAt.UTC()},
		UpdatedAt: s.UpdatedAt.UTC(), Rev: s.Revision, Secrets: s.Secrets,
	}
}

// readRecord decodes a stored document of any format up to FormatVersion.
// A later format's reader adds a case that upgrades the previous one.
func readRecord(raw bson.Raw) (Subscription, error) {
	name, _ := raw.Lookup("_id").StringValueOK()
	v, ok := raw.Lookup("version").AsInt64OK()
	switch {
	case !ok:
		return Subscription{}, fmt.Errorf("subscription %q: %w: no format version", name, ErrFormat)
	case v > FormatVersion:
		return Subscription{}, fmt.Errorf("subscription %q: %w: format %d was written by a newer changegate (this one reads formats 1 to %d)", name, ErrFormat, v, FormatVersion)
	case v < 1:
		return Subscription{}, fmt.Errorf("subscription %q: %w: format %d", name, ErrFormat, v)
	}
	var r record
	if err := bson.Unmarshal(raw, &r); err != nil {
		return Subscription{}, fmt.Errorf("subscription %q: %w: %v", name, ErrFormat, err)
	}
	if !json.Valid([]byte(r.Spec)) {
		return Subscription{}, fmt.Errorf("subscription %q: %w: its JSON form is not valid JSON", name, ErrFormat)
	}
	return Subscription{
		Name: r.Name, Spec: json.RawMessage(r.Spec), Status: r.Status, Reason: r.Reason,
		CreatedClusterTime: r.Created.ClusterTime, CreatedAt: r.Created.At.UTC(), UpdatedAt: r.UpdatedAt.UTC(),
		Revision: r.Rev, Secrets: r.Secrets,
	}, nil
}

// Options configure a Store.
type Options struct {
	// Collection and AuditCollection name the collections (defaults
	// DefaultCollection, DefaultAuditCollection).
	Collection, AuditCollection string
	// Sealer seals and opens the signing secrets; nil (no key configured)
	// makes Create and RotateSecret fail with ErrNoKey.
	Sealer *Sealer
	// Log receives the audit records too (nil: slog.Default()).
	Log *slog.Logger
	// Now is the clock (nil: time.Now).
	Now func() time.Time
	// DeleteGrace returns how long after a deletion what the subscription
	// parked or dead-lettered stays in the dead-letter store, to be read
	// or exported, before RunPurges removes it (nil or 0: at its next
	// run); asked at each deletion, so a reload's value applies.
	DeleteGrace func() time.Duration
	// OnStatus, when set, is called after each status change this Store
	// made (SetStatus), with the status before it, the subscription after
	// it and the actor: the operational notices (StatusNotice).
	OnStatus func(previous Status, sub Subscription, actor string)
}

// Store keeps subscriptions and their audit log in MongoDB. Every change
// writes its audit record in the same transaction. A Store is safe for
// concurrent use; changes are conditional on the revision read, so
// concurrent writers never lose each other's changes.
type Store struct {
	client *mongo.Client
	subs   *mongo.Collection
	audit  *mongo.Collection
	purges *mongo.Collection
	sealer *Sealer
	log    *slog.Logger
	now    func() time.Time

	onStatus    func(previous Status, sub Subscription, actor string)
	deleteGrace func() time.Duration
}

// NewStore returns a Store in db (the state database).
func NewStore(db *mongo.Database, o Options) *Store {
	if o.Collection == "" {
		o.Collection = DefaultCollection
	}
	if o.AuditCollection == "" {
		o.AuditCollection = DefaultAuditCollection
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	wc := options.Collection().SetWriteConcern(writeconcern.Majority())
	return &Store{
		client: db.Client(),
		subs:   db.Collection(o.Collection, wc),
		audit:  db.Collection(o.AuditCollection, wc),
		purges: db.Collection(DefaultPurgeCollection, wc),
		sealer: o.Sealer,
		log:    o.Log,
		now:    o.Now,

		onStatus:    o.OnStatus,
		deleteGrace: o.DeleteGrace,
	}
}

// Sealer returns the store's sealer (nil without a key).
func (s *Store) Sealer() *Sealer { return s.sealer }

// EnsureIndexes creates the audit log's index (by subscription, newest
// first).
func (s *Store) EnsureIndexes(ctx context.Context) error {
	_, err := s.audit.Indexes().CreateOne(ctx, mongo.IndexModel{
		Keys: bson.D{{Key: "subscription", Value: 1}, {Key: "_id", Value: -1}},
	})
	if err != nil {
		return fmt.Errorf("subscriptions: audit index: %w", err)
	}
	return nil
}

// Create stores a new active subscription named name with spec (its
// validated JSON form) and a new signing secret, which it returns: the only
// time it is returned besides RotateSecret. It fails with ErrNoKey without
// a key, ErrLimit when maxCount subscriptions are stored (0: no limit;
// two creates racing may pass it by one each), ErrExists when the name is
// taken.
func (s *Store) Create(ctx context.Context, actor, name string, spec json.RawMessage, maxCount int) (Subscription, config.Secret, error) {
	if s.sealer == nil {
		return Subscription{}, "", ErrNoKey
	}
	sess, err := s.client.StartSession()
	if err != nil {
		return Subscription{}, "", fmt.Errorf("subscription %s: create: %w", name, err)
	}
	defer sess.EndSession(ctx)
	sctx := mongo.NewSessionContext(ctx, sess)
	n, err := s.subs.CountDocuments(sctx, bson.D{})
	if err != nil {
		return Subscription{}, "", fmt.Errorf("subscription %s: create: count: %w", name, err)
	}
	if maxCount > 0 && n >= int64(maxCount) {
		return Subscription{}, "", fmt.Errorf("subscription %s: %w (%d)", name, ErrLimit, maxCount)
	}
	// The cluster time of the read: changes committed after it reach the
	// subscription (a few committed just before its creation may too).
	var ct bson.Timestamp
	if t := sess.OperationTime(); t != nil {
		ct = *t
	}
	secret, err := GenerateSecret()
	if err != nil {
		return Subscription{}, "", err
	}
	now := s.now().UTC()
	sealed, err := s.sealer.Seal(name, secret, now)
	if err != nil {
		return Subscription{}, "", err
	}
	sub := Subscription{
		Name: name, Spec: spec, Status: StatusActive, CreatedClusterTime: ct,
		CreatedAt: now, UpdatedAt: now, Revision: 1, Secrets: []SealedSecret{sealed},
	}
	rec := AuditRecord{At: now, Actor: actor, Action: ActionCreate, Subscription: name, Revision: 1}
	err = s.transact(ctx, rec, func(tctx context.Context) error {
		_, err := s.subs.InsertOne(tctx, toRecord(&sub))
		if mongo.IsDuplicateKeyError(err) {
			return fmt.Errorf("subscription %s: %w", name, ErrExists)
		}
		return err
	})
	if err != nil {
		return Subscription{}, "", err
	}
	return sub, secret, nil
}

// transact runs write and inserts the audit record in one transaction,
// then logs the record.
func (s *Store) transact(ctx context.Context, rec AuditRecord, write func(context.Context) error) error {
	sess, err := s.client.StartSession()
	if err != nil {
		return fmt.Errorf("subscription %s: %s: %w", rec.Subscription, rec.Action, err)
	}
	defer sess.EndSession(ctx)
	rec.ID = bson.NewObjectID()
	_, err = sess.WithTransaction(ctx, func(tctx context.Context) (any, error) {
		if err := write(tctx); err != nil {
			return nil, err
		}
		_, err := s.audit.InsertOne(tctx, rec)
		return nil, err
	})
	if err != nil {
		if errors.Is(err, ErrExists) || errors.Is(err, ErrConflict) || errors.Is(err, ErrNotFound) {
			return err
		}
		return fmt.Errorf("subscription %s: %s: %w", rec.Subscription, rec.Action, err)
	}
	s.log.Info("subscription audit", "actor", rec.Actor, "action", rec.Action, "subscription", rec.Subscription,
		"revision", rec.Revision, "detail", rec.Detail)
	return nil
}

// Get returns the subscription named name, or ErrNotFound.
func (s *Store) Get(ctx context.Context, name string) (Subscription, error) {
	raw, err := s.subs.FindOne(ctx, bson.D{{Key: "_id", Value: name}}).Raw()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return Subscription{}, fmt.Errorf("subscription %s: %w", name, ErrNotFound)
	}
	if err != nil {
		return Subscription{}, fmt.Errorf("subscription %s: get: %w", name, err)
	}
	return readRecord(raw)
}

// ListOptions select a page of List.
type ListOptions struct {
	// Prefix keeps the subscriptions whose names start with it ("": all).
	Prefix string
	// Cursor is the Next of the previous page ("": the first page).
	Cursor string
	// Limit is the page size (0: DefaultPageSize; at most MaxPageSize).
	Limit int
}

// Page is one page of List, in name order.
type Page struct {
	Subscriptions []Subscription
	// Next is the cursor of the next page; "" on the last one.
	Next string
}

// CursorAfter returns the List cursor of the page after the subscription
// named name.
func CursorAfter(name string) string { return base64.RawURLEncoding.EncodeToString([]byte(name)) }

// CursorName returns the name a List cursor pages after ("" for the first
// page), or ErrBadCursor.
func CursorName(cursor string) (string, error) {
	if cursor == "" {
		return "", nil
	}
	after, err := base64.RawURLEncoding.DecodeString(cursor)
	if err != nil || len(after) == 0 {
		return "", ErrBadCursor
	}
	return string(after), nil
}

// List returns a page of subscriptions in name order.
func (s *Store) List(ctx context.Context, o ListOptions) (Page, error) {
	limit := o.Limit
	if limit <= 0 {
		limit = DefaultPageSize
	}
	limit = min(limit, MaxPageSize)
	rng := bson.D{}
	if o.Prefix != "" {
		// Names are of [A-Za-z0-9_.-]: every name with the prefix sorts
		// below prefix + "\x7f".
		rng = append(rng, bson.E{Key: "$gte", Value: o.Prefix}, bson.E{Key: "$lt", Value: o.Prefix + "\x7f"})
	}
	if o.Cursor != "" {
		after, err := CursorName(o.Cursor)
		if err != nil {
			return Page{}, err
		}
		rng = append(rng, bson.E{Key: "$gt", Value: after})
	}
	filter := bson.D{}
	if len(rng) > 0 {
		filter = bson.D{{Key: "_id", Value: rng}}
	}
	cur, err := s.subs.Find(ctx, filter, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}).SetLimit(int64(limit+1)))
	if err != nil {
		return Page{}, fmt.Errorf("subscriptions: list: %w", err)
	}
	defer cur.Close(ctx)
	var p Page
	for cur.Next(ctx) {
		if len(p.Subscriptions) == limit {
			p.Next = CursorAfter(p.Subscriptions[limit-1].Name)
			break
		}
		sub, err := readRecord(cur.Current)
		if err != nil {
			return Page{}, err
		}
		p.Subscriptions = append(p.Subscriptions, sub)
	}
	if err := cur.Err(); err != nil {
		return Page{}, fmt.Errorf("subscriptions: list: %w", err)
	}
	return p, nil
}

// All returns every subscription, in name order. A document this release
// cannot read is logged and left out (the others still apply).
func (s *Store) All(ctx context.Context) ([]Subscription, error) {
	cur, err := s.subs.Find(ctx, bson.D{}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("subscriptions: read: %w", err)
	}
	defer cur.Close(ctx)
	var out []Subscription
	for cur.Next(ctx) {
		sub, err := readRecord(cur.Current)
		if err != nil {
			s.log.Error("subscription not applied", "err", err)
			continue
		}
		out = append(out, sub)
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("subscriptions: read: %w", err)
	}
	return out, nil
}

// modify applies change to the subscription named name and writes it at
// the next revision, with its audit record, conditionally on the revision
// read: with expected > 0 that must be the current revision (else
// ErrConflict); with 0 a concurrent change makes it read and apply again.
// change returns the audit detail, or an error that aborts.
func (s *Store) modify(ctx context.Context, actor, action, name string, expected int64, change func(*Subscription) (string, error)) (Subscription, error) {
	for attempt := 0; ; attempt++ {
		sub, err := s.Get(ctx, name)
		if err != nil {
			return Subscription{}, err
		}
		if expected > 0 && sub.Revision != expected {
			return Subscription{}, fmt.Errorf("subscription %s: %w (revision %d, not %d)", name, ErrConflict, sub.Revision, expected)
		}
		read := sub.Revision
		sub.Secrets = slices.Clone(sub.Secrets)
		detail, err := change(&sub)
		if err != nil {
			return Subscription{}, err
		}
		sub.Revision = read + 1
		sub.UpdatedAt = s.now().UTC()
		rec := AuditRecord{At: sub.UpdatedAt, Actor: actor, Action: action, Subscription: name, Revision: sub.Revision, Detail: detail}
		err = s.transact(ctx, rec, func(tctx context.Context) error {
			res, err := s.subs.ReplaceOne(tctx, bson.D{{Key: "_id", Value: name}, {Key: "rev", Value: read}}, toRecord(&sub))
			if err != nil {
				return err
			}
			if res.MatchedCount == 0 {
				return fmt.Errorf("subscription %s: %w", name, ErrConflict)
			}
			return nil
		})
		if errors.Is(err, ErrConflict) && expected == 0 && attempt < 10 {
			continue
		}
		if err != nil {
			return Subscription{}, err
		}
		return sub, nil
	}
}

// Update replaces the subscription's JSON form with spec (validated),
// conditionally on revision expected (0: any). Its status and secrets stay.
func (s *Store) Update(ctx context.Context, actor, name string, expected int64, spec json.RawMessage) (Subscription, error) {
	return s.modify(ctx, actor, ActionUpdate, name, expected, func(sub *Subscription) (string, error) {
		detail := changedFields(sub.Spec, spec)
		sub.Spec = spec
		return detail, nil
	})
}

// SetStatus pauses (StatusPaused), resumes (StatusActive) or disables
// (StatusDisabled) the subscription, with reason (shown with the status;
// cleared on resume), conditionally on revision expected (0: any).
func (s *Store) SetStatus(ctx context.Context, actor, name string, expected int64, status Status, reason string) (Subscription, error) {
	action := map[Status]string{StatusActive: ActionResume, StatusPaused: ActionPause, StatusDisabled: ActionDisable}[status]
	if action == "" {
		return Subscription{}, fmt.Errorf("subscription %s: unknown status %q", name, status)
	}
	if status == StatusActive {
		reason = ""
	}
	var previous Status
	sub, err := s.modify(ctx, actor, action, name, expected, func(sub *Subscription) (string, error) {
		previous = sub.Status
		sub.Status, sub.Reason = status, reason
		return reason, nil
	})
	if err == nil && s.onStatus != nil {
		s.onStatus(previous, sub, actor)
	}
	return sub, err
}

// RotateSecret gives the subscription a new signing secret, which it
// returns; the previous one keeps signing for overlap (0: not at all; at
// most MaxOverlap). Conditional on revision expected (0: any).
func (s *Store) RotateSecret(ctx context.Context, actor, name string, expected int64, overlap time.Duration) (Subscription, config.Secret, error) {
	if s.sealer == nil {
		return Subscription{}, "", ErrNoKey
	}
	if overlap < 0 || overlap > MaxOverlap {
		return Subscription{}, "", fmt.Errorf("subscription %s: overlap %s: must be between 0s and %s", name, overlap, MaxOverlap)
	}
	secret, err := GenerateSecret()
	if err != nil {
		return Subscription{}, "", err
	}
	sub, err := s.modify(ctx, actor, ActionRotate, name, expected, func(sub *Subscription) (string, error) {
		now := s.now().UTC()
		sealed, err := s.sealer.Seal(name, secret, now)
		if err != nil {
			return "", err
		}
		sub.Secrets = rotate(sub.Secrets, sealed, now, overlap)
		return "overlap " + overlap.String(), nil
	})
	if err != nil {
		return Subscription{}, "", err
	}
	return sub, secret, nil
}

// Delete removes the subscription, conditionally on revision expected (0:
// any), and schedules in the same transaction the purge of what its sink
// parked or dead-lettered, DeleteGrace later (RunPurges), which it returns.
func (s *Store) Delete(ctx context.Context, actor, name string, expected int64) (Purge, error) {
	for attempt := 0; ; attempt++ {
		sub, err := s.Get(ctx, name)
		if err != nil {
			return Purge{}, err
		}
		if expected > 0 && sub.Revision != expected {
			return Purge{}, fmt.Errorf("subscription %s: %w (revision %d, not %d)", name, ErrConflict, sub.Revision, expected)
		}
		now, grace := s.now().UTC(), time.Duration(0)
		if s.deleteGrace != nil {
			grace = s.deleteGrace()
		}
		p := Purge{Sink: name, Revision: sub.Revision, DeletedAt: now, PurgeAt: now.Add(grace)}
		rec := AuditRecord{At: now, Actor: actor, Action: ActionDelete, Subscription: name, Revision: sub.Revision,
			Detail: "parked and dead-lettered entries removed after " + grace.String()}
		err = s.transact(ctx, rec, func(tctx context.Context) error {
			res, err := s.subs.DeleteOne(tctx, bson.D{{Key: "_id", Value: name}, {Key: "rev", Value: sub.Revision}})
			if err != nil {
				return err
			}
			if res.DeletedCount == 0 {
				return fmt.Errorf("subscription %s: %w", name, ErrConflict)
			}
			return s.insertPurge(tctx, name, sub.Revision, p.DeletedAt, p.PurgeAt)
		})
		if errors.Is(err, ErrConflict) && expected == 0 && attempt < 10 {
			continue
		}
		if err != nil {
			return Purge{}, err
		}
		return p, nil
	}
}

// Audit returns up to limit audit records, newest first, of the
// subscription named name ("": of every subscription).
func (s *Store) Audit(ctx context.Context, name string, limit int) ([]AuditRecord, error) {
	filter := bson.D{}
	if name != "" {
		filter = bson.D{{Key: "subscription", Value: name}}
	}
	if limit <= 0 || limit > MaxPageSize {
		limit = MaxPageSize
	}
	cur, err := s.audit.Find(ctx, filter, options.Find().SetSort(bson.D{{Key: "_id", Value: -1}}).SetLimit(int64(limit)))
	if err != nil {
		return nil, fmt.Errorf("subscriptions: audit: %w", err)
	}
	var out []AuditRecord
	if err := cur.All(ctx, &out); err != nil {
		return nil, fmt.Errorf("subscriptions: audit: %w", err)
	}
	for i := range out {
		out[i].At = out[i].At.UTC()
	}
	return out, nil
}

// changedFields names the top-level fields of the JSON form that differ
// between old and new ("sink, filter"): the audit detail of an update,
// which never holds values.
func changedFields(old, new json.RawMessage) string {
	var a, b map[string]json.RawMessage
	_ = json.Unmarshal(old, &a)
	_ = json.Unmarshal(new, &b)
	var out []string
	for k, v := range b {
		if w, ok := a[k]; !ok || string(w) != string(v) {
			out = append(out, k)
		}
	}
	for k := range a {
		if _, ok := b[k]; !ok {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	if len(out) == 0 {
		return "no change"
	}
	return "changed: " + strings.Join(out, ", ")
}
