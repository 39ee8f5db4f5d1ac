// A fake of the part of CANN that k3's shim calls, for tests on machines
// without an NPU: host memory stands in for device memory and streams run
// their queued work only when something waits for it. It is built by the
// tests as libascendcl.so, libnnopbase.so and libopapi.so.
#ifndef FAKECANN_H
#define FAKECANN_H

#include <stddef.h>
#include <stdint.h>

// Codes used by the fake, as documented for the real libraries.
#define ACL_ERROR_INVALID_PARAM 100000
#define ACL_ERROR_BAD_ALLOC 200000
#define ACL_ERROR_RT_CONTEXT_NULL 107002
#define ACL_ERROR_RT_AICORE_EXCEPTION 507015
#define ACLNN_ERR_PARAM_NULLPTR 161001
#define ACLNN_ERR_PARAM_INVALID 161002

// A unit of stream work. Tasks are reference counted: a queue and a
// captured graph may both hold one.
typedef struct fk_task fk_task;
struct fk_task {
	int refs;
	int (*run)(fk_task *); // returns an error code, 0 on success
	void (*release)(fk_task *);
};

// Exported by the fake libascendcl for the other fake libraries.
void fk_set_error(const char *fmt, ...);
int fk_need_context(void);                     // 0, or an error code with the message set
int fk_is_device(const void *p, size_t n);     // [p, p+n) lies in one live device allocation
int fk_enqueue(void *stream, fk_task *t);      // 0, or an error code with the message set

// Descriptors of the fake libnnopbase, read by the fake operators.
#define FK_MAXDIM 8
typedef struct {
	uint32_t magic;
	int nd, nsd;
	int dtype, format;
	int64_t dims[FK_MAXDIM], strides[FK_MAXDIM], sdims[FK_MAXDIM];
	int64_t offset;
	void *data;
} fk_tensor;

typedef struct fk_exec fk_exec;
struct fk_exec {
	uint32_t magic;
	int repeatable;
	uint64_t ws;                              // workspace bytes phase 2 needs
	fk_tensor t[12];                          // operands, copied at phase 1
	double attr, attr2;                       // scalar attributes (eps, alpha, beta, threshold)
	int iattr;                                // an integer attribute (a dtype)
	int (*run)(fk_exec *, void *ws);         // the computation, on the stream
};

typedef struct {
	uint32_t magic;
	int dtype;
	double v;
} fk_scalar;

int fk_tensor_ok(const void *t);
int fk_int_array_get(const void *a, uint64_t *n, const int64_t **v);
int fk_tensor_list_get(const void *l, uint64_t *n, const void *const **ts); // 0, or -1 for a dead list
int fk_scalar_ok(const void *s);
fk_exec *fk_exec_new(void);
int fk_exec_live(const fk_exec *e);
void fk_exec_free(fk_exec *e);
int fk_launch(const char *op, void *ws, uint64_t wsSize, fk_exec *e, void *stream);
double fk_get(const fk_tensor *t, int64_t i);  // element at linear offset i (in elements)
void fk_put(const fk_tensor *t, int64_t i, double v);

#endif
