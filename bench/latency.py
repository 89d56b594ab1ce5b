"""latency: (to do)."""

def add_arguments(p):
    pass

async def run(args):
    return {"figures": []}
