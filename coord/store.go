// Package coord is stormdock's coordination store: versioned keys, session-bound entries,
// watches and leader election, backed by ZooKeeper or by an embedded in-process server.
//
// Keys are absolute slash-separated paths ("/jobs/wordcount"). Every key has a value and a
// data version that starts at 0 on creation and grows by one on every Put; passing that
// version back to Put or Delete makes the write a compare-and-set that fails with
// ErrConflict when someone else wrote in between. Entries created with Ephemeral or
// EphemeralSequential belong to the client's session and disappear when it ends.
//
// Session expiry: both implementations open a new session by themselves after the old one
// expired, and re-create the Ephemeral (non-sequential) entries this client created and has
// not deleted, with the value it last wrote. SessionEvents reports SessionExpired and then
// SessionNew listing what was restored or lost. EphemeralSequential entries (election
// candidates) are not re-created: an Election notices the loss and closes Leadership.Done.
package coord

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Sentinel errors. Errors returned by a Store wrap one of them; test with errors.Is.
var (
	ErrNotFound    = errors.New("coord: key not found")
	ErrExists      = errors.New("coord: key already exists")
	ErrConflict    = errors.New("coord: version conflict")
	ErrNotEmpty    = errors.New("coord: key has children")
	ErrInvalid     = errors.New("coord: invalid request")
	ErrPermission  = errors.New("coord: permission denied")
	ErrUnavailable = errors.New("coord: store unavailable")
	ErrClosed      = errors.New("coord: store closed")
)

// AnyVersion makes Put and Delete unconditional; in a Check op it checks existence only.
const AnyVersion int64 = -1

// Mode says how long a created entry lives and how it is named.
type Mode int

const (
	// Persistent entries live until deleted.
	Persistent Mode = iota
	// Ephemeral entries live as long as the creating client's session.
	Ephemeral
	// PersistentSequential entries get a 10-digit increasing suffix appended to the key.
	PersistentSequential
	// EphemeralSequential entries are Ephemeral with a sequential suffix.
	EphemeralSequential
)

func (m Mode) String() string {
	switch m {
	case Persistent:
		return "persistent"
	case Ephemeral:
		return "ephemeral"
	case PersistentSequential:
		return "persistent-sequential"
	case EphemeralSequential:
		return "ephemeral-sequential"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

func (m Mode) ephemeral() bool  { return m == Ephemeral || m == EphemeralSequential }
func (m Mode) sequential() bool { return m == PersistentSequential || m == EphemeralSequential }
func (m Mode) valid() bool      { return m >= Persistent && m <= EphemeralSequential }

// Entry is one key's value and metadata.
type Entry struct {
	Key     string
	Value   []byte
	Version int64 // data version: 0 at creation, +1 per Put
	// CreateRev and ModRev are store-wide revisions (ZooKeeper zxids) of the entry's
	// creation and last modification; they tell a re-created key from the old one.
	CreateRev int64
	ModRev    int64
	Owner     int64 // session id owning an ephemeral entry, 0 for persistent ones
}

// Ephemeral reports whether the entry is bound to a session.
func (e Entry) Ephemeral() bool { return e.Owner != 0 }

// Event is the state of a watched key after a change: the current value and version, or
// Exists false once the key is gone.
type Event struct {
	Key    string
	Exists bool
	Entry  Entry // zero unless Exists
}

// ChildrenEvent is the current list of a watched key's children after a change.
type ChildrenEvent struct {
	Key      string
	Exists   bool
	Children []string // sorted child names (not full keys)
	Version  int64    // children version: grows by one per child added or removed
}

// SessionEventType says what happened to a client's session.
type SessionEventType int

const (
	// SessionDisconnected: the connection dropped; the session may still be alive.
	SessionDisconnected SessionEventType = iota + 1
	// SessionReconnected: the connection is back with the same session; nothing was lost.
	SessionReconnected
	// SessionExpired: the session ended; its ephemeral entries are gone.
	SessionExpired
	// SessionNew: a new session replaced an expired one; Restored and Lost say which of
	// this client's ephemeral entries were re-created.
	SessionNew
)

func (t SessionEventType) String() string {
	switch t {
	case SessionDisconnected:
		return "disconnected"
	case SessionReconnected:
		return "reconnected"
	case SessionExpired:
		return "expired"
	case SessionNew:
		return "new-session"
	}
	return fmt.Sprintf("SessionEventType(%d)", int(t))
}

// SessionEvent reports a change of the client's session.
type SessionEvent struct {
	Type      SessionEventType
	SessionID int64    // the session the event is about (the old one for SessionExpired)
	Restored  []string // SessionNew: ephemeral keys re-created under the new session
	Lost      []string // SessionNew: ephemeral keys that could not be re-created
}

// KV reads and writes keys.
type KV interface {
	// Get returns the entry at key or ErrNotFound.
	Get(ctx context.Context, key string) (Entry, error)
	// Put sets key's value. With version >= 0 it is a compare-and-set: ErrConflict when the
	// current version differs, ErrNotFound when the key is missing. With AnyVersion it
	// creates the key (persistent, with missing parents) if needed. It returns the new
	// version.
	Put(ctx context.Context, key string, value []byte, version int64) (int64, error)
	// Create makes a new key (ErrExists if present), creating missing parents as persistent
	// keys, and returns the created key (with its suffix for sequential modes).
	Create(ctx context.Context, key string, value []byte, mode Mode) (string, error)
	// Delete removes key, if version >= 0 only at that version. A key with children fails
	// with ErrNotEmpty.
	Delete(ctx context.Context, key string, version int64) error
	// Children lists the names of key's children, sorted.
	Children(ctx context.Context, key string) ([]string, error)
	// Txn applies all ops atomically or none of them (see Op).
	Txn(ctx context.Context, ops ...Op) ([]OpResult, error)
}

// Watcher streams the state of keys. The channels stay armed until ctx is done or the store
// is closed, and then close. The first event is the state when the watch started; each
// later event is the state re-read after a change, so intermediate states may be skipped
// but the last event always equals the key's current state. Watches survive reconnects and
// session expiry.
type Watcher interface {
	Watch(ctx context.Context, key string) (<-chan Event, error)
	WatchChildren(ctx context.Context, key string) (<-chan ChildrenEvent, error)
}

// Session exposes the client's session.
type Session interface {
	// SessionID is the current session's id (0 while none is established).
	SessionID() int64
	// SessionEvents returns a channel of this client's session changes, closed when ctx is
	// done or the store closes. Events are never dropped.
	SessionEvents(ctx context.Context) <-chan SessionEvent
}

// Syncer proves that the store's quorum answers this client.
type Syncer interface {
	// Sync returns once the server this client talks to has heard from the store's leader
	// since the call: ZooKeeper sends sync to the leader and answers it once the leader has
	// answered, and a leader answers only while a quorum follows it (it steps down after
	// syncLimit ticks without one). A read after Sync is as fresh as the leader's view when
	// Sync was sent. A plain read is not: a follower cut off from its leader goes on
	// answering reads from its own copy, and on answering its clients' pings, until it
	// notices (syncLimit ticks), while the leader may already have expired their sessions.
	// The embedded store is its own leader: Sync returns at once while the client has a
	// session.
	Sync(ctx context.Context) error
}

// Store is a coordination store client with its own session.
type Store interface {
	KV
	Watcher
	Session
	Syncer
	io.Closer
}

// ValidateKey checks that key is an absolute, clean path: it starts with "/", has no empty,
// "." or ".." segments, no trailing slash (except the root "/") and no NUL bytes.
func ValidateKey(key string) error {
	if key == "/" {
		return nil
	}
	if !strings.HasPrefix(key, "/") {
		return fmt.Errorf("%w: key %q must start with /", ErrInvalid, key)
	}
	if strings.ContainsRune(key, 0) {
		return fmt.Errorf("%w: key %q contains NUL", ErrInvalid, key)
	}
	for _, seg := range strings.Split(key[1:], "/") {
		switch seg {
		case "":
			return fmt.Errorf("%w: key %q has an empty segment", ErrInvalid, key)
		case ".", "..":
			return fmt.Errorf("%w: key %q has a relative segment", ErrInvalid, key)
		}
	}
	return nil
}

// parentKey returns the parent of a valid non-root key.
func parentKey(key string) string {
	i := strings.LastIndexByte(key, '/')
	if i <= 0 {
		return "/"
	}
	return key[:i]
}

// baseName returns the last segment of a valid key.
func baseName(key string) string { return key[strings.LastIndexByte(key, '/')+1:] }

// joinKey joins a parent key and a child name.
func joinKey(parent, name string) string {
	if parent == "/" {
		return "/" + name
	}
	return parent + "/" + name
}

// ancestors returns the proper ancestors of key from the outermost, excluding "/".
func ancestors(key string) []string {
	var out []string
	for i := 1; i < len(key); i++ {
		if key[i] == '/' {
			out = append(out, key[:i])
		}
	}
	return out
}
