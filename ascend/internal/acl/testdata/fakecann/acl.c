// The fake libascendcl: contexts, memory, copies, streams, events and
// graph capture.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fake.h"

static pthread_mutex_t mu = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static __thread char errmsg[512];
static __thread void *current;

void fk_set_error(const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(errmsg, sizeof errmsg, fmt, ap);
	va_end(ap);
}

const char *aclGetRecentErrMsg(void) { return errmsg; }

// ---- contexts

#define CTX_MAGIC 0x63747831u
typedef struct {
	uint32_t magic;
	int dev;
} ctx_t;

static int inited;

int aclInit(const char *cfg) {
	(void)cfg;
	inited = 1;
	return 0;
}

int aclFinalize(void) { return 0; }

int aclrtGetDeviceCount(uint32_t *n) {
	*n = 2;
	return 0;
}

int aclrtCreateContext(void **ctx, int32_t dev) {
	if (!inited) {
		fk_set_error("aclInit has not been called");
		return ACL_ERROR_INVALID_PARAM;
	}
	if (dev < 0 || dev >= 2) {
		fk_set_error("device %d does not exist (2 devices)", dev);
		return ACL_ERROR_INVALID_PARAM;
	}
	ctx_t *c = calloc(1, sizeof *c);
	c->magic = CTX_MAGIC;
	c->dev = dev;
	*ctx = c;
	current = c;
	return 0;
}

int aclrtDestroyContext(void *ctx) {
	ctx_t *c = ctx;
	if (c == NULL || c->magic != CTX_MAGIC) {
		fk_set_error("aclrtDestroyContext: not a context");
		return ACL_ERROR_INVALID_PARAM;
	}
	c->magic = 0;
	if (current == c) current = NULL;
	free(c);
	return 0;
}

int aclrtSetCurrentContext(void *ctx) {
	ctx_t *c = ctx;
	if (c == NULL || c->magic != CTX_MAGIC) {
		fk_set_error("aclrtSetCurrentContext: not a live context");
		return ACL_ERROR_INVALID_PARAM;
	}
	current = c;
	return 0;
}

int fk_need_context(void) {
	if (current == NULL) {
		fk_set_error("no current context on this thread (aclrtSetCurrentContext was not called on it)");
		return ACL_ERROR_RT_CONTEXT_NULL;
	}
	return 0;
}

#define NEED_CONTEXT()                   \
	do {                                 \
		int rc_ = fk_need_context();     \
		if (rc_) return rc_;             \
	} while (0)

// ---- memory

enum { DEVICE = 1, PINNED = 2 };
typedef struct {
	char *base;
	size_t n;
	int kind;
} alloc_t;
static alloc_t *allocs;
static int nallocs, capallocs;
static size_t device_used;
static const size_t device_total = (size_t)1 << 30;

static void track(void *p, size_t n, int kind) {
	if (nallocs == capallocs) {
		capallocs = capallocs ? 2 * capallocs : 64;
		allocs = realloc(allocs, capallocs * sizeof *allocs);
	}
	allocs[nallocs++] = (alloc_t){p, n, kind};
}

static alloc_t *find(const void *p, size_t n, int kind) {
	const char *c = p;
	for (int i = 0; i < nallocs; i++) {
		alloc_t *a = &allocs[i];
		if (a->kind == kind && c >= a->base && c + n <= a->base + a->n) return a;
	}
	return NULL;
}

static int untrack(void *p, int kind) {
	for (int i = 0; i < nallocs; i++) {
		if (allocs[i].base == p && allocs[i].kind == kind) {
			if (kind == DEVICE) device_used -= allocs[i].n;
			allocs[i] = allocs[--nallocs];
			return 0;
		}
	}
	return -1;
}

int fk_is_device(const void *p, size_t n) {
	pthread_mutex_lock(&mu);
	int ok = find(p, n, DEVICE) != NULL;
	pthread_mutex_unlock(&mu);
	return ok;
}

int aclrtMalloc(void **p, size_t n, int policy) {
	NEED_CONTEXT();
	if (n == 0 || policy < 0 || policy > 5) {
		fk_set_error("aclrtMalloc: size %zu policy %d", n, policy);
		return ACL_ERROR_INVALID_PARAM;
	}
	pthread_mutex_lock(&mu);
	if (device_used + n > device_total) {
		pthread_mutex_unlock(&mu);
		fk_set_error("aclrtMalloc: %zu bytes requested, %zu of %zu in use", n, device_used, device_total);
		return ACL_ERROR_BAD_ALLOC;
	}
	// The real allocator rounds to 32 bytes and pads 32 more; callers must
	// not rely on the padding, so only n bytes count as the allocation.
	void *m = aligned_alloc(512, (n + 32 + 511) / 512 * 512);
	memset(m, 0xff, n); // device memory is not zeroed: NaNs catch reads of it
	track(m, n, DEVICE);
	device_used += n;
	pthread_mutex_unlock(&mu);
	*p = m;
	return 0;
}

int aclrtFree(void *p) {
	NEED_CONTEXT();
	pthread_mutex_lock(&mu);
	int rc = untrack(p, DEVICE);
	pthread_mutex_unlock(&mu);
	if (rc) {
		fk_set_error("aclrtFree: %p is not device memory from aclrtMalloc", p);
		return ACL_ERROR_INVALID_PARAM;
	}
	free(p);
	return 0;
}

int aclrtMallocHost(void **p, size_t n) {
	NEED_CONTEXT();
	void *m = aligned_alloc(64, (n + 63) / 64 * 64);
	pthread_mutex_lock(&mu);
	track(m, n, PINNED);
	pthread_mutex_unlock(&mu);
	*p = m;
	return 0;
}

int aclrtFreeHost(void *p) {
	NEED_CONTEXT();
	pthread_mutex_lock(&mu);
	int rc = untrack(p, PINNED);
	pthread_mutex_unlock(&mu);
	if (rc) {
		fk_set_error("aclrtFreeHost: %p is not from aclrtMallocHost", p);
		return ACL_ERROR_INVALID_PARAM;
	}
	free(p);
	return 0;
}

// checkcopy validates a copy's addresses for its kind; async copies need
// pinned host memory and 64-byte-aligned device addresses.
static int checkcopy(void *dst, size_t dmax, const void *src, size_t n, int kind, int async) {
	if (n > dmax) {
		fk_set_error("copy of %zu bytes into a destination of %zu", n, dmax);
		return ACL_ERROR_INVALID_PARAM;
	}
	int dk = kind == 1 || kind == 3 ? DEVICE : async ? PINNED : 0;
	int sk = kind == 2 || kind == 3 ? DEVICE : async ? PINNED : 0;
	if (kind < 0 || kind > 3) {
		fk_set_error("memcpy kind %d", kind);
		return ACL_ERROR_INVALID_PARAM;
	}
	pthread_mutex_lock(&mu);
	int okd = dk == 0 || find(dst, n, dk), oks = sk == 0 || find(src, n, sk);
	pthread_mutex_unlock(&mu);
	if (!okd || !oks) {
		fk_set_error("memcpy kind %d: %s %p (%zu bytes) is not %s memory", kind, okd ? "source" : "destination",
			okd ? src : dst, n, (okd ? sk : dk) == DEVICE ? "device" : "pinned host (aclrtMallocHost)");
		return ACL_ERROR_INVALID_PARAM;
	}
	if (async && kind == 3 && (((uintptr_t)dst | (uintptr_t)src) & 63)) {
		fk_set_error("asynchronous device copy needs 64-byte aligned addresses");
		return ACL_ERROR_INVALID_PARAM;
	}
	return 0;
}

int aclrtMemcpy(void *dst, size_t dmax, const void *src, size_t n, int kind) {
	NEED_CONTEXT();
	int rc = checkcopy(dst, dmax, src, n, kind, 0);
	if (rc) return rc;
	memmove(dst, src, n);
	return 0;
}

typedef struct {
	fk_task t;
	void *dst;
	const void *src;
	size_t n;
} copy_task;

static int run_copy(fk_task *t) {
	copy_task *c = (copy_task *)t;
	memmove(c->dst, c->src, c->n);
	return 0;
}

static void release_free(fk_task *t) { free(t); }

// ---- streams and events

#define STREAM_MAGIC 0x73747231u
#define EVENT_MAGIC 0x65767431u
#define GRAPH_MAGIC 0x67726831u

typedef struct graph graph_t;
typedef struct {
	uint32_t magic;
	void *ctx;
	fk_task **q;
	int head, len, cap;
	int sticky; // the first error of a task that ran
	char sticky_msg[512]; // its message
	graph_t *capturing;
	pthread_t capture_thread;
	pthread_t running; // the thread draining it, while busy
	int busy;
} stream_t;

// A graph holds the tasks of every stream in the capture in the order
// they were issued, which keeps each event's record before its waits.
// Streams join the capture by waiting for an event recorded in it and
// return when the capturing stream (origin) waits for an event recorded
// on them (ACL's cross-stream capture).
struct graph {
	uint32_t magic;
	fk_task **tasks;
	int len, cap;
	void *origin;
	int active;
	struct {
		void *s;
		int returned, after;
	} joined[16];
	int njoined;
};

// Each record of an event is a generation; a wait waits for the
// generation recorded when the wait was queued (as the real runtime's do),
// so a later record of the same event neither completes nor delays it.
typedef struct {
	uint32_t magic;
	void *ctx;
	stream_t *stream; // where it was last recorded
	graph_t *graph;   // the capture its last record was captured into
	unsigned long recorded, done; // generations recorded, and the newest whose record ran
	struct timespec at;
} event_t;

static int stream_ok(stream_t *s, const char *api) {
	if (s == NULL || s->magic != STREAM_MAGIC) {
		fk_set_error("%s: not a live stream", api);
		return ACL_ERROR_INVALID_PARAM;
	}
	if (s->ctx != current) {
		fk_set_error("%s: the stream belongs to another context than this thread's current one", api);
		return ACL_ERROR_INVALID_PARAM;
	}
	return 0;
}

static void push(fk_task ***arr, int *len, int *cap, fk_task *t) {
	if (*len == *cap) {
		*cap = *cap ? 2 * *cap : 16;
		*arr = realloc(*arr, *cap * sizeof **arr);
	}
	(*arr)[(*len)++] = t;
	t->refs++;
}

static void unref(fk_task *t) {
	if (--t->refs == 0) t->release(t);
}

int fk_enqueue(void *stream, fk_task *t) {
	stream_t *s = stream;
	int rc = stream_ok(s, "enqueue");
	if (rc) return rc;
	pthread_mutex_lock(&mu);
	if (s->capturing) {
		graph_t *g = s->capturing;
		for (int i = 0; i < g->njoined; i++)
			if (g->joined[i].s == s && g->joined[i].returned) g->joined[i].after++;
		push(&g->tasks, &g->len, &g->cap, t);
	} else {
		push(&s->q, &s->len, &s->cap, t);
	}
	pthread_mutex_unlock(&mu);
	return 0;
}

static pthread_cond_t idle = PTHREAD_COND_INITIALIZER;

// drain_until runs what is queued on s in order, everything (done NULL)
// or until *done reaches gen: a wait for an event runs the recording
// stream only up to that record, as the device would. Called with mu
// held; the tasks run with mu released, so that a collective waiting for
// the other ranks does not stop their streams. A stream drained by another
// thread is waited for.
static void drain_until(stream_t *s, const unsigned long *done, unsigned long gen) {
	if (s->busy && pthread_equal(s->running, pthread_self())) return; // a wait cycle on this thread
	while (s->busy) pthread_cond_wait(&idle, &mu);
	s->busy = 1;
	s->running = pthread_self();
	while (s->head < s->len && (done == NULL || *done < gen)) {
		fk_task *t = s->q[s->head++];
		pthread_mutex_unlock(&mu);
		int rc = t->run(t);
		pthread_mutex_lock(&mu);
		if (rc && !s->sticky) {
			s->sticky = rc;
			memcpy(s->sticky_msg, errmsg, sizeof s->sticky_msg);
		}
		unref(t);
	}
	if (s->head == s->len) s->head = s->len = 0;
	s->busy = 0;
	pthread_cond_broadcast(&idle);
}

static void drain(stream_t *s) { drain_until(s, NULL, 0); }

int aclrtCreateStream(void **out) {
	NEED_CONTEXT();
	stream_t *s = calloc(1, sizeof *s);
	s->magic = STREAM_MAGIC;
	s->ctx = current;
	*out = s;
	return 0;
}

int aclrtSynchronizeStream(void *stream) {
	NEED_CONTEXT();
	stream_t *s = stream;
	int rc = stream_ok(s, "aclrtSynchronizeStream");
	if (rc) return rc;
	if (s->capturing) {
		fk_set_error("aclrtSynchronizeStream: the stream is capturing");
		return ACL_ERROR_INVALID_PARAM;
	}
	pthread_mutex_lock(&mu);
	drain(s);
	rc = s->sticky;
	s->sticky = 0;
	pthread_mutex_unlock(&mu);
	if (rc) fk_set_error("a task on the stream failed with %d: %s", rc, s->sticky_msg);
	return rc;
}

int aclrtDestroyStream(void *stream) {
	NEED_CONTEXT();
	stream_t *s = stream;
	int rc = stream_ok(s, "aclrtDestroyStream");
	if (rc) return rc;
	pthread_mutex_lock(&mu);
	drain(s); // the real runtime finishes queued work first
	s->magic = 0;
	free(s->q);
	free(s);
	pthread_mutex_unlock(&mu);
	return 0;
}

int aclrtMemcpyAsync(void *dst, size_t dmax, const void *src, size_t n, int kind, void *stream) {
	NEED_CONTEXT();
	int rc = checkcopy(dst, dmax, src, n, kind, 1);
	if (rc) return rc;
	copy_task *c = calloc(1, sizeof *c);
	c->t.run = run_copy;
	c->t.release = release_free;
	c->dst = dst;
	c->src = src;
	c->n = n;
	c->t.refs = 1;
	rc = fk_enqueue(stream, &c->t);
	unref(&c->t);
	return rc;
}

typedef struct {
	fk_task t;
	void *dst;
	int value;
	size_t n;
} set_task;

static int run_set(fk_task *t) {
	set_task *c = (set_task *)t;
	memset(c->dst, c->value, c->n);
	return 0;
}

int aclrtMemsetAsync(void *dst, size_t dmax, int32_t value, size_t n, void *stream) {
	NEED_CONTEXT();
	if (n > dmax || !fk_is_device(dst, n)) {
		fk_set_error("aclrtMemsetAsync: %p (%zu of %zu bytes) is not device memory", dst, n, dmax);
		return ACL_ERROR_INVALID_PARAM;
	}
	set_task *c = calloc(1, sizeof *c);
	c->t.run = run_set;
	c->t.release = release_free;
	c->dst = dst;
	c->value = value;
	c->n = n;
	c->t.refs = 1;
	int rc = fk_enqueue(stream, &c->t);
	unref(&c->t);
	return rc;
}

int aclrtCreateEvent(void **out) {
	NEED_CONTEXT();
	event_t *e = calloc(1, sizeof *e);
	e->magic = EVENT_MAGIC;
	e->ctx = current;
	*out = e;
	return 0;
}

static int event_ok(event_t *e, const char *api) {
	if (e == NULL || e->magic != EVENT_MAGIC) {
		fk_set_error("%s: not a live event", api);
		return ACL_ERROR_INVALID_PARAM;
	}
	return 0;
}

typedef struct {
	fk_task t;
	event_t *e;
	unsigned long gen; // the generation recorded, or waited for
	stream_t *src;     // for a wait: the stream of that record
} event_task;

static int run_record(fk_task *t) {
	event_task *et = (event_task *)t;
	event_t *e = et->e;
	pthread_mutex_lock(&mu);
	if (et->gen > e->done) e->done = et->gen;
	pthread_mutex_unlock(&mu);
	clock_gettime(CLOCK_MONOTONIC, &e->at);
	return 0;
}

static int run_wait(fk_task *t) {
	event_task *et = (event_task *)t;
	pthread_mutex_lock(&mu);
	if (et->e->done < et->gen && et->src) drain_until(et->src, &et->e->done, et->gen);
	pthread_mutex_unlock(&mu);
	return 0;
}

static int event_task_enqueue(void *stream, event_t *e, int (*run)(fk_task *), unsigned long gen, stream_t *src) {
	event_task *et = calloc(1, sizeof *et);
	et->t.run = run;
	et->t.release = release_free;
	et->e = e;
	et->gen = gen;
	et->src = src;
	et->t.refs = 1;
	int rc = fk_enqueue(stream, &et->t);
	unref(&et->t);
	return rc;
}

int aclrtRecordEvent(void *event, void *stream) {
	NEED_CONTEXT();
	event_t *e = event;
	int rc = event_ok(e, "aclrtRecordEvent");
	if (!rc) rc = stream_ok(stream, "aclrtRecordEvent");
	if (rc) return rc;
	pthread_mutex_lock(&mu);
	unsigned long gen = ++e->recorded;
	e->stream = stream;
	e->graph = ((stream_t *)stream)->capturing;
	pthread_mutex_unlock(&mu);
	return event_task_enqueue(stream, e, run_record, gen, NULL);
}

int aclrtStreamWaitEvent(void *stream, void *event) {
	NEED_CONTEXT();
	event_t *e = event;
	stream_t *s = stream;
	int rc = event_ok(e, "aclrtStreamWaitEvent");
	if (!rc) rc = stream_ok(s, "aclrtStreamWaitEvent");
	if (rc) return rc;
	pthread_mutex_lock(&mu);
	graph_t *g = e->graph;
	if (g != NULL && g->active) {
		if (s->capturing == NULL) {
			if (g->njoined == 16) {
				pthread_mutex_unlock(&mu);
				fk_set_error("aclrtStreamWaitEvent: the fake joins at most 16 streams to a capture");
				return ACL_ERROR_INVALID_PARAM;
			}
			s->capturing = g;
			g->joined[g->njoined].s = s;
			g->joined[g->njoined].returned = g->joined[g->njoined].after = 0;
			g->njoined++;
		} else if (s->capturing != g) {
			pthread_mutex_unlock(&mu);
			fk_set_error("aclrtStreamWaitEvent: the stream is capturing another model");
			return ACL_ERROR_INVALID_PARAM;
		} else if (s == g->origin) {
			for (int i = 0; i < g->njoined; i++)
				if (g->joined[i].s == e->stream) g->joined[i].returned = 1;
		} else if (e->stream == g->origin) {
			// Forked again: in the capture until it returns once more.
			for (int i = 0; i < g->njoined; i++)
				if (g->joined[i].s == s) g->joined[i].returned = 0;
		}
	} else if (s->capturing != NULL) {
		pthread_mutex_unlock(&mu);
		fk_set_error("aclrtStreamWaitEvent: the event was not recorded in the capture");
		return ACL_ERROR_INVALID_PARAM;
	}
	unsigned long want = e->recorded;
	stream_t *src = e->stream;
	pthread_mutex_unlock(&mu);
	return event_task_enqueue(stream, e, run_wait, want, src);
}

int aclrtSynchronizeEvent(void *event) {
	NEED_CONTEXT();
	event_t *e = event;
	int rc = event_ok(e, "aclrtSynchronizeEvent");
	if (rc) return rc;
	pthread_mutex_lock(&mu);
	if (e->done < e->recorded && e->stream) drain_until(e->stream, &e->done, e->recorded);
	pthread_mutex_unlock(&mu);
	return 0;
}

int aclrtEventElapsedTime(float *ms, void *start, void *end) {
	NEED_CONTEXT();
	event_t *a = start, *b = end;
	int rc = event_ok(a, "aclrtEventElapsedTime");
	if (!rc) rc = event_ok(b, "aclrtEventElapsedTime");
	if (rc) return rc;
	if (a->done < a->recorded || b->done < b->recorded || !a->recorded || !b->recorded) {
		fk_set_error("aclrtEventElapsedTime: an event has not completed");
		return ACL_ERROR_INVALID_PARAM;
	}
	*ms = (float)((b->at.tv_sec - a->at.tv_sec) * 1e3 + (b->at.tv_nsec - a->at.tv_nsec) / 1e6);
	return 0;
}

int aclrtDestroyEvent(void *event) {
	NEED_CONTEXT();
	event_t *e = event;
	int rc = event_ok(e, "aclrtDestroyEvent");
	if (rc) return rc;
	e->magic = 0;
	// Tasks may still point at it; the real runtime defers the release
	// too. The fake keeps the memory.
	return 0;
}

// ---- graph capture

int aclmdlRICaptureBegin(void *stream, int mode) {
	NEED_CONTEXT();
	stream_t *s = stream;
	int rc = stream_ok(s, "aclmdlRICaptureBegin");
	if (rc) return rc;
	if (mode < 0 || mode > 2) {
		fk_set_error("aclmdlRICaptureBegin: mode %d", mode);
		return ACL_ERROR_INVALID_PARAM;
	}
	if (s->capturing) {
		fk_set_error("aclmdlRICaptureBegin: the stream is already capturing");
		return ACL_ERROR_INVALID_PARAM;
	}
	graph_t *g = calloc(1, sizeof *g);
	g->magic = GRAPH_MAGIC;
	g->origin = s;
	g->active = 1;
	pthread_mutex_lock(&mu);
	s->capturing = g;
	s->capture_thread = pthread_self();
	pthread_mutex_unlock(&mu);
	return 0;
}

int aclmdlRICaptureEnd(void *stream, void **out) {
	NEED_CONTEXT();
	stream_t *s = stream;
	int rc = stream_ok(s, "aclmdlRICaptureEnd");
	if (rc) return rc;
	if (!s->capturing) {
		fk_set_error("aclmdlRICaptureEnd: the stream is not capturing");
		return ACL_ERROR_INVALID_PARAM;
	}
	if (!pthread_equal(s->capture_thread, pthread_self())) {
		fk_set_error("aclmdlRICaptureEnd: called on another thread than aclmdlRICaptureBegin");
		return ACL_ERROR_INVALID_PARAM;
	}
	pthread_mutex_lock(&mu);
	graph_t *g = s->capturing;
	s->capturing = NULL;
	g->active = 0;
	rc = 0;
	for (int i = 0; i < g->njoined; i++) {
		((stream_t *)g->joined[i].s)->capturing = NULL;
		if (rc) continue;
		if (!g->joined[i].returned) {
			fk_set_error("aclmdlRICaptureEnd: a stream joined the capture by an event and did not return to the capturing stream");
			rc = ACL_ERROR_INVALID_PARAM;
		} else if (g->joined[i].after) {
			fk_set_error("aclmdlRICaptureEnd: %d tasks were issued on a joined stream after it returned", g->joined[i].after);
			rc = ACL_ERROR_INVALID_PARAM;
		}
	}
	if (rc) {
		for (int i = 0; i < g->len; i++) unref(g->tasks[i]);
		g->magic = 0;
		free(g->tasks);
		free(g);
		pthread_mutex_unlock(&mu);
		return rc;
	}
	pthread_mutex_unlock(&mu);
	*out = g;
	return 0;
}

int aclmdlRIExecuteAsync(void *model, void *stream) {
	NEED_CONTEXT();
	graph_t *g = model;
	if (g == NULL || g->magic != GRAPH_MAGIC) {
		fk_set_error("aclmdlRIExecuteAsync: not a live graph");
		return ACL_ERROR_INVALID_PARAM;
	}
	for (int i = 0; i < g->len; i++) {
		int rc = fk_enqueue(stream, g->tasks[i]);
		if (rc) return rc;
	}
	return 0;
}

int aclmdlRIDestroy(void *model) {
	NEED_CONTEXT();
	graph_t *g = model;
	if (g == NULL || g->magic != GRAPH_MAGIC) {
		fk_set_error("aclmdlRIDestroy: not a live graph");
		return ACL_ERROR_INVALID_PARAM;
	}
	pthread_mutex_lock(&mu);
	for (int i = 0; i < g->len; i++) unref(g->tasks[i]);
	g->magic = 0;
	free(g->tasks);
	free(g);
	pthread_mutex_unlock(&mu);
	return 0;
}

// fk_lock serialises the operator libraries' registries with the runtime.
void fk_lock(void) { pthread_mutex_lock(&mu); }
void fk_unlock(void) { pthread_mutex_unlock(&mu); }
