// Package multidc runs the output router of mirrored jobs: one copy of a job per data center
// ("link"), and exactly one link's output forwarded to the sink, in offset order, with failover.
//
// # Model
//
// Every link of a mirrored job reads the same replayable input and tags each output record
// with the input offset it derives from (0, 1, 2, ...; each offset yields exactly one record).
// The router buffers what every link sends, forwards the records of one link, the active one,
// to the sink in offset order (offset d only after d-1), and remembers the first offset not
// yet delivered. When the active link stops heartbeating, or an operator fails it over, the
// router switches to the standby with the longest contiguous run of records from that offset
// and continues there, so the sink sees every offset exactly once across the switch.
//
// # Ingest protocol (what a worker does)
//
// The router serves HTTPS (a certificate from the router CA, see tls.go); STORMDOCK_OUTPUT is
// its base URL (https://HOST:PORT), STORMDOCK_ROUTER_CA the CA a sender trusts.
// Sender implements this side of the protocol for Go workers.
//
//	POST /v1/records?link=L&worker=I      body: JSON lines, one record per line
//
// Each line is a JSON object with an integer "offset" (>= 0) and a string "link" (it may be
// left out when ?link= is given; when both are given they must agree). The whole line is
// the record and reaches the sink unchanged. Optional "worker" and "workers" fields (or
// ?worker=) make the batch count as a heartbeat of that worker. Answers:
//
//	200 {"accepted":N,"duplicates":D,"instance":"..","nextOffset":K}
//	400 {"error":"line 3: ...","code":"bad_input"}  unknown link, malformed line, missing
//	    or bad offset: nothing of the batch was taken; do not retry, fix the sender
//	413 {"error":"body over ...","code":"too_large"}  send smaller batches
//	429 {"accepted":..,"rejected":R,"retryAfterMs":M,"code":"rate_limited","instance":..,"nextOffset":K}
//	    backpressure: a buffer is full; the lines counted in accepted were taken
//	503 {"error":"..","code":"not_ready"}  the router is starting, waiting to lead, or stopping
//
// Error answers are api.ErrorBody values, their codes those of the api package's table.
//
// On 429, 503 or a connection error the sender waits (retryAfterMs, or its own backoff)
// and re-sends the same batch: re-sending is always safe, because the router drops every
// offset it already holds from that link or already delivered. POST / is the same as
// POST /v1/records, for workers that post to STORMDOCK_OUTPUT as it is.
//
//	POST /v1/heartbeat?link=L&worker=I&workers=N
//	200 {"active":"dc-a","nextOffset":K,"instance":".."}
//
// Every worker sends a heartbeat at a fixed interval (200 ms by default; at most a third of
// the router's heartbeat timeout) whether or not it has output: workers may be idle. A link
// is alive while every one of its N workers (from workers=N; without it, the workers heard
// from in the last ten timeouts) has been heard from within the timeout, so the death of a
// single worker of the active link fails the link over. Faster still, when a connection a
// worker used closes and the worker does not beat again within the close grace (half the
// timeout), the worker counts as dead: a killed process's sockets are closed by its kernel.
//
// nextOffset is the first offset not yet delivered: everything below it is in the sink, so
// a (re)starting worker resumes its input there instead of replaying from 0, and a worker
// may skip ahead to it at any time.
//
// instance names the router's current run. The router holds accepted records in memory
// until it delivers them, so when instance changes between two answers, the router
// restarted and lost what it had accepted but not delivered: the worker must rewind its
// input to that answer's nextOffset and send everything again from there (the rewind is
// what makes a router crash lose nothing; what is sent twice is dropped as duplicate).
// Idle workers must watch for it too: their last records may be among the lost ones.
//
// # Buffers and backpressure
//
// Per link the router holds the records at or above the first undelivered offset, at most
// Limits.Window offsets ahead of it and Limits.Bytes payload bytes. Records below that
// offset are dropped on arrival or as soon as it passes them (they are delivered), so a full
// buffer only ever holds undelivered records: the router never drops those, it answers 429
// instead and the sender retries. The record at the first undelivered offset itself is
// always taken, so a full buffer cannot stall delivery.
//
// # Store keys
//
// cluster.RouterKey(job) (/routers/<job>) holds a RouterRecord: the checkpoint (every offset
// up to it is in the sink), the active link and the status, rewritten with compare-and-set by
// the one router that leads the election under cluster.RouterElectionKey(job)
// (/routers/<job>/election).
//
// # Exactly once across router restarts
//
// A restarted router continues after max(checkpoint, the sink's own last offset). The file
// sink reads its last complete line (cutting a torn one off) so the file, not the checkpoint,
// says what was delivered; the checkpoint is written only after the file is synced. The
// HTTP sink cannot be asked: records delivered after the last checkpoint may be sent again
// after a crash, each with its offset, so the receiver can drop them (at-least-once there).
package multidc
