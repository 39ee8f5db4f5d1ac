// The fake libhccl: communicators of ranks that are threads of one
// process. A collective is a stream task; when a rank's stream runs it,
// the task waits until every rank's stream has reached the same
// collective, the last one to arrive computes the result for all (the sum
// in rank order, so every rank gets the same bits) and all go on.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake.h"

#define HCCL_E_PARA 1
#define HCCL_E_PTR 2
#define HCCL_E_NOT_SUPPORT 5
#define HCCL_E_INTERNAL 4

#define ROOT_MAGIC 0x726f6f74u
#define MAXRANK 16

typedef struct {
	char internal[4108];
} HcclRootInfo;

enum { AR, AG, RS, A2A, SEND, RECV, BARRIER };

typedef struct call call_t;
struct call {
	fk_task t;
	int kind, rank;
	void *comm;
	const float *send;
	float *recv;
	uint64_t count; // AR: all; AG: send count; RS: recv count; p2p: count
	int op, peer;
	uint64_t scount[MAXRANK], sdispl[MAXRANK], rcount[MAXRANK], rdispl[MAXRANK];
	uint64_t seq;
};

typedef struct {
	uint64_t seq;
	int arrived, left;
	call_t *calls[MAXRANK];
	int done;
	int err;
} meeting_t;

typedef struct group {
	uint64_t id;
	int n, joined;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	meeting_t meets[64]; // by sequence number modulo 64
	meeting_t p2p[MAXRANK][MAXRANK][8]; // [from][to][pseq % 8]
	struct group *next;
} group_t;

typedef struct {
	uint32_t magic;
	group_t *g;
	int rank;
	uint64_t seq;                // collectives enqueued
	uint64_t sent[MAXRANK];      // sends enqueued to each rank
	uint64_t received[MAXRANK];  // receives enqueued from each rank
} comm_t;

#define COMM_MAGIC 0x636f6d6du

static pthread_mutex_t gmu = PTHREAD_MUTEX_INITIALIZER;
static group_t *groups;
static uint64_t next_id = 1;

const char *HcclGetErrorString(int code) {
	switch (code) {
	case 0: return "success";
	case HCCL_E_PARA: return "parameter error";
	case HCCL_E_PTR: return "empty pointer";
	case HCCL_E_INTERNAL: return "internal error";
	case HCCL_E_NOT_SUPPORT: return "not supported";
	}
	return "unknown error";
}

int HcclGetRootInfo(HcclRootInfo *root) {
	if (fk_need_context()) return HCCL_E_INTERNAL;
	if (root == NULL) return HCCL_E_PTR;
	memset(root, 0, sizeof *root);
	pthread_mutex_lock(&gmu);
	uint64_t id = next_id++;
	pthread_mutex_unlock(&gmu);
	uint32_t magic = ROOT_MAGIC;
	memcpy(root->internal, &magic, 4);
	memcpy(root->internal + 8, &id, 8);
	return 0;
}

int HcclCommInitRootInfo(uint32_t n, const HcclRootInfo *root, uint32_t rank, void **comm) {
	if (fk_need_context()) return HCCL_E_INTERNAL;
	uint32_t magic;
	uint64_t id;
	if (root == NULL || comm == NULL) return HCCL_E_PTR;
	memcpy(&magic, root->internal, 4);
	memcpy(&id, root->internal + 8, 8);
	if (magic != ROOT_MAGIC || n == 0 || n > MAXRANK || rank >= n) {
		fk_set_error("HcclCommInitRootInfo: root info, %u ranks or rank %u invalid", n, rank);
		return HCCL_E_PARA;
	}
	pthread_mutex_lock(&gmu);
	group_t *g = groups;
	while (g && g->id != id) g = g->next;
	if (g == NULL) {
		g = calloc(1, sizeof *g);
		g->id = id;
		g->n = (int)n;
		pthread_mutex_init(&g->mu, NULL);
		pthread_cond_init(&g->cv, NULL);
		g->next = groups;
		groups = g;
	}
	int bad = g->n != (int)n;
	if (!bad) g->joined++;
	pthread_mutex_unlock(&gmu);
	if (bad) {
		fk_set_error("HcclCommInitRootInfo: %u ranks, the group has %d", n, g->n);
		return HCCL_E_PARA;
	}
	comm_t *c = calloc(1, sizeof *c);
	c->magic = COMM_MAGIC;
	c->g = g;
	c->rank = (int)rank;
	*comm = c;
	return 0;
}

int HcclCommDestroy(void *comm) {
	comm_t *c = comm;
	if (c == NULL || c->magic != COMM_MAGIC) return HCCL_E_PTR;
	c->magic = 0;
	free(c);
	return 0;
}

static double reduce(double a, double b, int op) {
	switch (op) {
	case 1: return a * b;
	case 2: return a > b ? a : b;
	case 3: return a < b ? a : b;
	}
	return a + b;
}

// collective computes a meeting's result for every rank. Called by the
// last rank to arrive, with the group's lock held.
static void collective(meeting_t *m, int n) {
	call_t *c0 = m->calls[0];
	switch (c0->kind) {
	case AR: {
		float *tmp = malloc(c0->count * sizeof(float));
		for (uint64_t i = 0; i < c0->count; i++) {
			double s = m->calls[0]->send[i];
			for (int r = 1; r < n; r++) s = reduce(s, m->calls[r]->send[i], c0->op);
			tmp[i] = (float)s;
		}
		for (int r = 0; r < n; r++) memcpy(m->calls[r]->recv, tmp, c0->count * sizeof(float));
		free(tmp);
		break;
	}
	case AG:
		for (int r = 0; r < n; r++)
			for (int q = 0; q < n; q++) memcpy(m->calls[r]->recv + q * c0->count, m->calls[q]->send, c0->count * sizeof(float));
		break;
	case RS: {
		uint64_t k = c0->count;
		float *tmp = malloc(n * k * sizeof(float));
		for (uint64_t i = 0; i < n * k; i++) {
			double s = m->calls[0]->send[i];
			for (int r = 1; r < n; r++) s = reduce(s, m->calls[r]->send[i], c0->op);
			tmp[i] = (float)s;
		}
		for (int r = 0; r < n; r++) memcpy(m->calls[r]->recv, tmp + r * k, k * sizeof(float));
		free(tmp);
		break;
	}
	case A2A:
		for (int r = 0; r < n; r++) {
			for (int j = 0; j < n; j++) {
				call_t *from = m->calls[j], *to = m->calls[r];
				if (from->scount[r] != to->rcount[j]) {
					fk_set_error("HcclAlltoAllV: rank %d sends %llu to rank %d, which expects %llu", j,
						(unsigned long long)from->scount[r], r, (unsigned long long)to->rcount[j]);
					m->err = HCCL_E_PARA;
					return;
				}
				memcpy(to->recv + to->rdispl[j], from->send + from->sdispl[r], from->scount[r] * sizeof(float));
			}
		}
		break;
	case BARRIER:
		break;
	}
}

// meet waits at m until want calls arrived, the last computing them.
static int meet(group_t *g, meeting_t *m, call_t *c, int slot, int want, uint64_t seq) {
	pthread_mutex_lock(&g->mu);
	while (m->arrived > 0 && m->seq != seq) pthread_cond_wait(&g->cv, &g->mu); // slot still used by an older call
	if (m->arrived == 0) {
		m->seq = seq;
		m->done = 0;
		m->err = 0;
	}
	m->calls[slot] = c;
	if (++m->arrived == want) {
		if (want == 2 && (c->kind == SEND || c->kind == RECV)) {
			call_t *s = m->calls[0], *r = m->calls[1];
			if (s->count != r->count) {
				fk_set_error("HcclSend of %llu elements met HcclRecv of %llu", (unsigned long long)s->count,
					(unsigned long long)r->count);
				m->err = HCCL_E_PARA;
			} else {
				memcpy(r->recv, s->send, s->count * sizeof(float));
			}
		} else {
			for (int r = 0; r < want; r++) {
				if (m->calls[r]->kind != c->kind || m->calls[r]->count != c->count) {
					fk_set_error("ranks called different collectives (kinds %d and %d, counts %llu and %llu)", m->calls[r]->kind,
						c->kind, (unsigned long long)m->calls[r]->count, (unsigned long long)c->count);
					m->err = HCCL_E_PARA;
				}
			}
			if (!m->err) collective(m, want);
		}
		m->done = 1;
		m->left = want;
		pthread_cond_broadcast(&g->cv);
	}
	while (!m->done) pthread_cond_wait(&g->cv, &g->mu);
	int err = m->err;
	if (--m->left == 0) {
		m->arrived = 0;
		pthread_cond_broadcast(&g->cv);
	}
	pthread_mutex_unlock(&g->mu);
	return err ? ACL_ERROR_RT_AICORE_EXCEPTION : 0;
}

static int run_call(fk_task *t) {
	call_t *c = (call_t *)t;
	comm_t *cm = c->comm;
	group_t *g = cm->g;
	switch (c->kind) {
	case SEND: return meet(g, &g->p2p[c->rank][c->peer][c->seq % 8], c, 0, 2, c->seq);
	case RECV: return meet(g, &g->p2p[c->peer][c->rank][c->seq % 8], c, 1, 2, c->seq);
	}
	return meet(g, &g->meets[c->seq % 64], c, c->rank, g->n, c->seq);
}

static void release_call(fk_task *t) { free(t); }

// enqueue checks the comm and buffers and queues the call on the stream.
static int enqueue(call_t *c, void *comm, int dtype, void *stream, uint64_t sendBytes, uint64_t recvBytes) {
	comm_t *cm = comm;
	if (fk_need_context()) {
		free(c);
		return HCCL_E_INTERNAL;
	}
	if (cm == NULL || cm->magic != COMM_MAGIC) {
		fk_set_error("not a live communicator");
		free(c);
		return HCCL_E_PTR;
	}
	if (dtype != 4) {
		fk_set_error("data type %d (the fake takes FP32 = 4)", dtype);
		free(c);
		return HCCL_E_NOT_SUPPORT;
	}
	if ((sendBytes && !fk_is_device(c->send, sendBytes)) || (recvBytes && !fk_is_device(c->recv, recvBytes))) {
		fk_set_error("a buffer is not device memory of the size the counts imply");
		free(c);
		return HCCL_E_PARA;
	}
	c->comm = cm;
	c->rank = cm->rank;
	if (c->kind == SEND) {
		c->seq = cm->sent[c->peer]++;
	} else if (c->kind == RECV) {
		c->seq = cm->received[c->peer]++;
	} else {
		c->seq = cm->seq++;
	}
	c->t.run = run_call;
	c->t.release = release_call;
	c->t.refs = 1;
	int rc = fk_enqueue(stream, &c->t);
	if (--c->t.refs == 0) free(c);
	return rc ? HCCL_E_PARA : 0;
}

static call_t *newcall(int kind, const void *send, void *recv, uint64_t count) {
	call_t *c = calloc(1, sizeof *c);
	c->kind = kind;
	c->send = send;
	c->recv = recv;
	c->count = count;
	return c;
}

static int nranks(void *comm) {
	comm_t *cm = comm;
	return cm && cm->magic == COMM_MAGIC ? cm->g->n : 1;
}

int HcclAllReduce(void *send, void *recv, uint64_t count, int dtype, int op, void *comm, void *stream) {
	call_t *c = newcall(AR, send, recv, count);
	c->op = op;
	return enqueue(c, comm, dtype, stream, count * 4, count * 4);
}

int HcclAllGather(void *send, void *recv, uint64_t count, int dtype, void *comm, void *stream) {
	return enqueue(newcall(AG, send, recv, count), comm, dtype, stream, count * 4, count * 4 * nranks(comm));
}

int HcclReduceScatter(void *send, void *recv, uint64_t count, int dtype, int op, void *comm, void *stream) {
	call_t *c = newcall(RS, send, recv, count);
	c->op = op;
	return enqueue(c, comm, dtype, stream, count * 4 * nranks(comm), count * 4);
}

int HcclAlltoAllV(const void *send, const uint64_t *sendCounts, const uint64_t *sdispls, int sendType, void *recv,
	const uint64_t *recvCounts, const uint64_t *rdispls, int recvType, void *comm, void *stream) {
	int n = nranks(comm);
	if (sendType != recvType || sendCounts == NULL || sdispls == NULL || recvCounts == NULL || rdispls == NULL) {
		fk_set_error("HcclAlltoAllV: count arrays or types");
		return HCCL_E_PARA;
	}
	call_t *c = newcall(A2A, send, recv, 0);
	uint64_t send_end = 0, recv_end = 0;
	for (int j = 0; j < n; j++) {
		c->scount[j] = sendCounts[j];
		c->sdispl[j] = sdispls[j];
		c->rcount[j] = recvCounts[j];
		c->rdispl[j] = rdispls[j];
		if (sendCounts[j] && sdispls[j] + sendCounts[j] > send_end) send_end = sdispls[j] + sendCounts[j];
		if (recvCounts[j] && rdispls[j] + recvCounts[j] > recv_end) recv_end = rdispls[j] + recvCounts[j];
	}
	return enqueue(c, comm, sendType, stream, send_end * 4, recv_end * 4);
}

int HcclSend(void *buf, uint64_t count, int dtype, uint32_t dst, void *comm, void *stream) {
	if ((int)dst >= nranks(comm)) return HCCL_E_PARA;
	call_t *c = newcall(SEND, buf, NULL, count);
	c->peer = (int)dst;
	return enqueue(c, comm, dtype, stream, count * 4, 0);
}

int HcclRecv(void *buf, uint64_t count, int dtype, uint32_t src, void *comm, void *stream) {
	if ((int)src >= nranks(comm)) return HCCL_E_PARA;
	call_t *c = newcall(RECV, NULL, buf, count);
	c->peer = (int)src;
	return enqueue(c, comm, dtype, stream, 0, count * 4);
}

int HcclBarrier(void *comm, void *stream) { return enqueue(newcall(BARRIER, NULL, NULL, 0), comm, 4, stream, 0, 0); }
