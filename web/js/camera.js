// The camera, on demand: one still frame at a time as a JPEG data URL, for a user message's
// `input_image` part. The stream opens at the first frame and stays open for the next ones until
// `close()` (the call's end), so the browser asks for the camera once per call.

const MAX_SIDE = 1024; // the frame's longer side, in pixels
const QUALITIES = [0.85, 0.7, 0.55, 0.4]; // JPEG qualities tried, best first, until the frame fits

/** The reason a camera could not be opened, in words for the page. */
export class CameraError extends Error {}

export class Camera {
  constructor() {
    this.stream = null;
    this.video = null;
  }

  async open() {
    if (this.video) return;
    if (!navigator.mediaDevices?.getUserMedia) {
      throw new CameraError("this browser gives no camera access here (the page needs https or localhost)");
    }
    try {
      this.stream = await navigator.mediaDevices.getUserMedia({ video: true, audio: false });
    } catch (err) {
      throw new CameraError(refusal(err));
    }
    const video = document.createElement("video");
    video.muted = true;
    video.playsInline = true;
    video.srcObject = this.stream;
    try {
      await video.play(); // resolves once frames flow: drawImage then has one to copy
    } catch (err) {
      this.close();
      throw new CameraError(`the camera opened but gave no picture: ${err.message || err}`);
    }
    this.video = video;
  }

  /** One frame, its longer side at most 1024 px, as a JPEG data URL of at most `maxChars`
   *  characters (a lower quality where the first does not fit): {url, width, height}. */
  async frame(maxChars = Infinity) {
    await this.open();
    const { videoWidth, videoHeight } = this.video;
    if (!videoWidth || !videoHeight) throw new CameraError("the camera gave an empty picture");
    const scale = Math.min(1, MAX_SIDE / Math.max(videoWidth, videoHeight));
    const canvas = document.createElement("canvas");
    canvas.width = Math.round(videoWidth * scale);
    canvas.height = Math.round(videoHeight * scale);
    canvas.getContext("2d").drawImage(this.video, 0, 0, canvas.width, canvas.height);
    for (const quality of QUALITIES) {
      const url = canvas.toDataURL("image/jpeg", quality);
      if (url.length <= maxChars) return { url, width: canvas.width, height: canvas.height };
    }
    throw new CameraError("the camera frame is too large for this connection, even at a low quality");
  }

  close() {
    this.stream?.getTracks().forEach((t) => t.stop());
    if (this.video) this.video.srcObject = null;
    this.stream = null;
    this.video = null;
  }
}

function refusal(err) {
  switch (err?.name) {
    case "NotAllowedError":
    case "SecurityError":
      return "the camera was refused: allow it for this page to share a frame";
    case "NotFoundError":
    case "OverconstrainedError":
      return "no camera was found";
    case "NotReadableError":
      return "the camera could not be started (another application may be using it)";
    default:
      return `the camera could not be opened: ${err?.message || err}`;
  }
}
