# Epoch 1 vs epoch 2 with and without --cache (docs/BENCHMARKS.md). Run: .venv/bin/python bench/epochs.py after cargo build --release.
import os, subprocess, time, tempfile, concurrent.futures as cf, boto3, botocore.config
os.environ["AWS_EC2_METADATA_DISABLED"]="true"
R=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "target/release/")
data=tempfile.mkdtemp()
emu = subprocess.Popen([R+"expressfs-emulator","--listen","127.0.0.1:0","--data-dir",data,"--bucket","ep--use1-az4--x-s3","--ttfb-ms","4"], stdout=subprocess.PIPE, text=True)
ep = emu.stdout.readline().split("listening on ")[1].strip()
s3 = boto3.client("s3", endpoint_url=ep, region_name="us-east-1", aws_access_key_id="AKIDEXPRESSFSTEST", aws_secret_access_key="expressfs-test-secret", config=botocore.config.Config(s3={"addressing_style":"path"}, max_pool_connections=64))
img=os.urandom(100_000)
with cf.ThreadPoolExecutor(32) as ex:
    list(ex.map(lambda i: s3.put_object(Bucket="ep--use1-az4--x-s3", Key=f"img/{i:05d}.jpg", Body=img), range(2000)))
shard=os.urandom(64<<20)
for i in range(4): s3.put_object(Bucket="ep--use1-az4--x-s3", Key=f"shard/{i}.tar", Body=shard)
env = dict(os.environ, AWS_ACCESS_KEY_ID="AKIDEXPRESSFSTEST", AWS_SECRET_ACCESS_KEY="expressfs-test-secret")
def epoch(mnt):
    t=time.time()
    names=[f"{mnt}/img/{i:05d}.jpg" for i in range(2000)]+[f"{mnt}/shard/{i}.tar" for i in range(4)]
    def rd(p):
        with open(p,"rb") as f:
            n=0
            while True:
                b=f.read(1<<20)
                if not b: return n
                n+=len(b)
    with cf.ThreadPoolExecutor(32) as ex: total=sum(ex.map(rd, names))
    return total/1e6/(time.time()-t)
def gets():
    import json, urllib.request
    st=json.load(urllib.request.urlopen(ep+"/_emulator/stats"))
    return st.get("ep--use1-az4--x-s3",{}).get("GetObject",{}).get("requests",0)
for label, extra in [("no cache", []), ("--cache", ["--cache", tempfile.mkdtemp()])]:
    mnt=tempfile.mkdtemp()
    d=subprocess.Popen([R+"expressfs","-f","--endpoint-url",ep,"--region","us-east-1","ep--use1-az4--x-s3",mnt]+extra, env=env, stderr=subprocess.DEVNULL)
    time.sleep(1)
    e1=epoch(mnt); time.sleep(1); g=gets(); e2=epoch(mnt); g2=gets()
    print(f"{label}: epoch 1 {e1:.0f} MB/s, epoch 2 {e2:.0f} MB/s, GETs to the bucket during epoch 2: {g2-g}")
    subprocess.run(["umount",mnt]); d.wait()
emu.kill()
